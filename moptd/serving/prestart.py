"""Every check a managed start must pass before moptd starts the engine.

In order: ``gates.run_gates`` (GPUs and their free memory, the port, the model directory, a
TensorRT-LLM engine directory against the serving environment's TensorRT-LLM release), the
version lock (``gates_versions``: CUDA runtime against the driver, the CUDA build against the
GPUs) and the production checklist (``gates_checklist``: tokenizer and weight headers load).
Blocking (NVML, file reads): the supervisors run it on a thread.
"""

from __future__ import annotations

from moptd.serving.environment import installed_versions, site_packages_of
from moptd.serving.gates import GateResult, run_gates
from moptd.serving.gates_checklist import checklist_gates
from moptd.serving.gates_versions import check_versions
from moptd.serving.spec import Managed


def prestart_gates(m: Managed) -> list[GateResult]:
    site_packages = site_packages_of(m.command)
    versions = installed_versions(site_packages) if site_packages else None
    return [*run_gates(m, versions), *check_versions(m), *checklist_gates(m)]
