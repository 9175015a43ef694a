"""Terraform's built-in functions for the sandbox evaluator: one module per group of Terraform's documentation,
each registering its functions on import; the rules every call follows are in registry.py."""

from gateway.adapters.engines.sandbox.functions import (  # noqa: F401  (each module registers its functions on import)
    clock,
    collection,
    conversion,
    crypto,
    encoding,
    filesystem,
    network,
    numeric,
    text,
)
from gateway.adapters.engines.sandbox.functions.conversion import issensitive, sensitive
from gateway.adapters.engines.sandbox.functions.registry import (
    FUNCTIONS,
    SPECIAL_FORMS,
    TERRAFORM_FUNCTIONS,
    UNSUPPORTED,
    CallContext,
    FileScope,
    FunctionCallError,
    FunctionError,
    call_function,
    documented_names,
    same_value,
    supported_names,
    to_bool,
    to_number,
    to_string,
)

__all__ = ["FUNCTIONS", "SPECIAL_FORMS", "TERRAFORM_FUNCTIONS", "UNSUPPORTED", "CallContext", "FileScope",
           "FunctionCallError", "FunctionError", "call_function", "documented_names", "issensitive", "same_value",
           "sensitive", "supported_names", "to_bool", "to_number", "to_string"]
