"""The ResilientTrainingJob API: pydantic models, the one source of the CRD."""
