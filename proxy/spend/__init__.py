"""Spend on the proxy: the records of each request, the on-disk spool, and its drainer.

`spool.SpendSpool` writes records (the hot path), `drainer.SpoolDrainer` seals and ships them
to the control plane's ledger, `estimate.estimate_tokens` counts tokens a provider did not
report. Nothing is imported here, so `proxy.settings` can import the spool's types cheaply.
"""
