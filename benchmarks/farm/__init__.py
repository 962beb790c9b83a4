"""The farm's front (``--no-ray``): CPU per call and per episode, AWM-1K on demand, the SDK's transport, the status window, all modes side by side."""
