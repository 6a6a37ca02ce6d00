"""The remediation policy: which finding may make the daemon act, how, and under which
guards (docs/remediation.md). Data and its validation only; the daemon's actuator
(moptd.daemon.remediation) is the one part that acts."""
