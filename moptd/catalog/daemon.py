"""Signals about moptd itself: collector health and build facts."""

from moptd.catalog.spec import SignalSpec

SIGNALS = [
    SignalSpec(
        "collector.success",
        "gauge",
        "bool",
        "1 if the collector's last run succeeded, 0 if it failed, timed out or found no "
        "data source (see moptd_collector_unavailable), NaN from start until its first run.",
        "collector",
        "moptd_collector_success",
    ),
    SignalSpec(
        "collector.duration",
        "gauge",
        "seconds",
        "Wall time of the collector's last run (NaN until its first run).",
        "collector",
        "moptd_collector_duration_seconds",
    ),
    SignalSpec(
        "collector.last_success",
        "gauge",
        "seconds",
        "Unix time of the collector's last successful run; alert on staleness.",
        "collector",
        "moptd_collector_last_success_timestamp_seconds",
    ),
    SignalSpec(
        "collector.unavailable",
        "gauge",
        "bool",
        "1 while the collector's data source is absent on this host (for example no "
        "NVIDIA driver); the reason is in moptd status.",
        "collector",
        "moptd_collector_unavailable",
    ),
    SignalSpec(
        "collector.failures",
        "counter",
        "count",
        "Runs of the collector that failed or timed out since moptd started.",
        "collector",
        "moptd_collector_failures_total",
    ),
    SignalSpec(
        "findings.store_ok",
        "gauge",
        "bool",
        "1 while the findings database (state_dir/findings.db) is written to disk; 0 while "
        "it runs in memory after a full disk or an unusable file (see /v1/health).",
        "node",
        "moptd_findings_store_ok",
    ),
    SignalSpec(
        "findings.board_fault_incidents",
        "gauge",
        "count",
        "Hardware-class findings (rules/hardware/board-history.yaml) this GPU's board had in "
        "the history window, by serial across resets, reboots and a new PCI address; "
        "from the findings database (moptd history).",
        "gpu",
        "moptd_gpu_board_fault_incidents",
    ),
    SignalSpec(
        "findings.board_fault_recurring",
        "gauge",
        "bool",
        "1 while the board's history meets a repeat threshold of "
        "rules/hardware/board-history.yaml (GPU_FAULT_RECURRING).",
        "gpu",
        "moptd_gpu_board_fault_recurring",
    ),
    SignalSpec(
        "findings.fault_location_processes",
        "gauge",
        "count",
        "The most different programs whose Xid 13/31 named one same place of this GPU "
        "(GPC/TPC/SM, MMU engine and client) in the window (GPU_FAULT_SAME_LOCATION).",
        "gpu",
        "moptd_gpu_fault_location_processes",
    ),
    SignalSpec(
        "finding.active",
        "gauge",
        "bool",
        "1 for each firing finding, like Prometheus' ALERTS; code is the stable diagnosis "
        "code, subject is node, gpu:<index> or serving:<name>.",
        "node",
        "moptd_finding_active",
        labels=("rule", "code", "severity", "subject"),
    ),
    SignalSpec(
        "finding.first_action",
        "info",
        "",
        "The first action of each firing finding, in the action label (at most 200 "
        "characters); value 1. Alert annotations read it (grafana/alerts).",
        "node",
        "moptd_finding_first_action_info",
        labels=("rule", "subject", "action"),
    ),
    SignalSpec(
        "finding.pending",
        "gauge",
        "bool",
        "1 for each pending finding (its condition holds, its for: has not yet elapsed).",
        "node",
        "moptd_finding_pending",
        labels=("rule", "code", "severity", "subject"),
    ),
    SignalSpec(
        "rules.failing",
        "gauge",
        "bool",
        "1 for each rule that raised in the last evaluation (on any subject): it diagnoses "
        "nothing there; the finding RULE_EVALUATION_FAILED says where and why.",
        "node",
        "moptd_rule_failing",
        labels=("rule",),
    ),
    SignalSpec(
        "rules.loaded",
        "gauge",
        "count",
        "Rules in force. It stays when a reload is refused (moptd_rules_load_errors > 0): the "
        "rules in force are the last set that loaded whole.",
        "node",
        "moptd_rules_loaded",
    ),
    SignalSpec(
        "rules.load_errors",
        "gauge",
        "count",
        "Errors of the last rule load or reload (SIGHUP, POST /v1/rules/reload); 0 once a "
        "set loads whole. /v1/rules and `moptd rules check` name each file, line and key.",
        "node",
        "moptd_rules_load_errors",
    ),
    SignalSpec(
        "rules.evaluation_errors",
        "counter",
        "count",
        "Evaluations of the rule (one per subject per tick) that raised since moptd started.",
        "node",
        "moptd_rule_evaluation_errors_total",
        labels=("rule",),
    ),
    SignalSpec(
        "rules.ticks_over_budget",
        "counter",
        "count",
        "Rule evaluations that ran past rules.tick_budget since moptd started: each left "
        "the (rule, subject) pairs it had not reached with their last result, and the next "
        "evaluation began with them.",
        "node",
        "moptd_rule_ticks_over_budget_total",
    ),
    SignalSpec(
        "rules.evaluations_deferred",
        "counter",
        "count",
        "(rule, subject) evaluations that an evaluation over rules.tick_budget left for the "
        "next one, since moptd started.",
        "node",
        "moptd_rule_evaluations_deferred_total",
    ),
    SignalSpec(
        "remediation.total",
        "counter",
        "count",
        "Remedies the remediation policy chose since moptd started, by the code that "
        "triggered them, the remedy and the outcome (done, dry-run, failed, "
        "interrupted, suppressed-by-guard); the audit trail is GET /v1/remediations.",
        "node",
        "moptd_remediations_total",
        labels=("code", "remedy", "outcome"),
    ),
    SignalSpec(
        "store.series_dropped",
        "counter",
        "count",
        "New series a source (a collector) brought past store.max_series since moptd "
        "started: not kept, not exported, not seen by rules. A rise means a label whose "
        "values keep changing (a hostile or broken serving endpoint).",
        "collector",
        "moptd_store_series_dropped_total",
    ),
    SignalSpec(
        "serving.scrapes_over_limit",
        "counter",
        "count",
        "Scrapes of the endpoint refused whole because the page broke a scrape limit "
        "(sample_limit, label_limit, label_name_length_limit, label_value_length_limit); "
        "serving.up is 0 and the scrape error names the limit.",
        "serving",
        "moptd_serving_scrapes_over_limit_total",
    ),
    SignalSpec(
        "node.build",
        "info",
        "",
        "moptd build facts; value 1.",
        "node",
        "moptd_build_info",
        labels=("version", "python"),
    ),
    SignalSpec(
        "node.software_version",
        "info",
        "",
        "A version this host runs, one series per component (driver, cuda, kernel, torch, "
        "vllm, sglang, tensorrt_llm), composed at scrape time from what the collectors "
        "stored (moptd/daemon/software.py); several versions of one component (two "
        "engines) are joined sorted with commas, at most 4. Value 1.",
        "node",
        "moptd_software_version_info",
        labels=("component", "version"),
    ),
    SignalSpec(
        "daemon.resident_memory",
        "gauge",
        "bytes",
        "Resident memory of the moptd process (VmRSS). Flat after warm-up; a rise means a leak.",
        "node",
        "moptd_daemon_resident_memory_bytes",
    ),
    SignalSpec(
        "daemon.cpu_seconds",
        "counter",
        "seconds",
        "CPU time (user + system) the moptd process has used since it started.",
        "node",
        "moptd_daemon_cpu_seconds_total",
    ),
    SignalSpec(
        "daemon.open_fds",
        "gauge",
        "count",
        "File descriptors the moptd process holds open.",
        "node",
        "moptd_daemon_open_fds",
    ),
    SignalSpec(
        "daemon.threads",
        "gauge",
        "count",
        "Threads of the moptd process (the NVML readers, the database thread, the executor).",
        "node",
        "moptd_daemon_threads",
    ),
    SignalSpec(
        "daemon.tasks",
        "gauge",
        "count",
        "asyncio tasks alive in the daemon's event loop.",
        "node",
        "moptd_daemon_tasks",
    ),
    SignalSpec(
        "daemon.gc_seconds",
        "counter",
        "seconds",
        "Time Python's cyclic garbage collector has taken in the moptd process since the "
        "self collector started; every thread waits while it runs.",
        "node",
        "moptd_daemon_gc_seconds_total",
    ),
]
