"""The NVIDIA daemons' own records (moptd.collectors.daemon_journals): Fabric Manager,
nvidia-persistenced, nvidia-container-cli."""

from moptd.catalog.spec import SignalSpec

SIGNALS = [
    SignalSpec(
        "daemon_logs.error",
        "event",
        "",
        "A failure record of nvidia-fabricmanager, nvidia-persistenced (their journals, "
        "Fabric Manager's log file) or nvidia-container-cli (the container engines' "
        "journals, a pasted error): emitter, diagnosis (the code its emitter catalog, "
        "moptd/catalog/emitters/, gives the message, or UNCLASSIFIED_ERROR for an error no "
        "entry knows; diagnoses: the same as a list, as kernel.xid's), matched (the catalog "
        "entry's text), message, level where the record or the catalog has one, source "
        "(the unit's journal or the file), line; messages/more tally an emitter's "
        "unclassified messages (moptd/kernel/daemon_log.py).",
        "node",
        None,
        (),
        "",
        (
            "emitter",
            "diagnosis",
            "diagnoses",
            "matched",
            "message",
            "level",
            "source",
            "line",
            "messages",
            "more",
        ),
    ),
]
