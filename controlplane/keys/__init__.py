"""Virtual keys: issue, rotate with a grace period, revoke, disable and enable."""
