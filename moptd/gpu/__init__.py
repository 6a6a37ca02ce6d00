"""GPU libraries: the NVML backends (live and recorded), the nvidia-smi dump reader, typed
readings, and the one table of clock-event reasons. Collectors read through them; nothing
here runs on its own."""
