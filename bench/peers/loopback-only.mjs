// Preload for Node servers that bind every interface and offer no host flag
// (the Portkey gateway calls @hono/node-server serve() without a hostname).
// Forces every net.Server.listen() onto BENCH_BIND_HOST (default 127.0.0.1).
//   node --import ./bench/peers/loopback-only.mjs \
//        node_modules/@portkey-ai/gateway/build/start-server.js --port=8787 --headless
import net from 'node:net';

const host = process.env.BENCH_BIND_HOST || '127.0.0.1';
const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (first !== null && typeof first === 'object' && !Array.isArray(first)) {
    // listen(options[, cb]); leave unix-socket (path) listeners alone
    if (first.path === undefined) args[0] = { ...first, host };
  } else if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, cb])
    if (args.length === 1 || typeof args[1] === 'string' || args[1] === undefined || args[1] === null) {
      args[1] = host;
    } else {
      args.splice(1, 0, host);
    }
  }
  return listen.apply(this, args);
};
