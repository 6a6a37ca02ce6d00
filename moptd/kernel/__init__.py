"""The kernel-log layer: format detection, matchers, the Xid catalog, incidents, /dev/kmsg."""
