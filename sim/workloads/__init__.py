"""Workloads: real traces (Mooncake, Azure), the synthetic multi-tenant mix, and how to open them."""

from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent / "traces"
"""The public traces shipped with the package (licences in ``traces/README.md``)."""

MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE_CODE = TRACES / "azure" / "AzureLLMInferenceTrace_code.csv"
