"""Terraform's built-in functions, with its null, unknown and type rules, for the sandbox evaluator.

A function is a plain Python function registered with `@function`; its parameters' annotations say
what Terraform's parameter types say, and `call_function` applies Terraform's rules before the body
runs, so bodies see clean values:

- arity: too few or too many arguments is an error naming the function;
- null: an argument may not be null unless the function takes nulls (`null_ok`, or a `... | None` annotation);
- unknown: an argument known only after apply makes the result unknown; a `shallow` function (say
  `length`, `concat`, `keys`) also runs on known collections holding unknown elements, as Terraform's do;
- types: strings, numbers and bools convert into each other as Terraform converts them, anything
  else is `Invalid value for "str" parameter: string required`;
- marks: a sensitive argument makes the result sensitive (the strongest mark wins, see values.py),
  and an error decided by a masked argument never quotes it.

File functions read relative to the stack's directory, as Terraform reads relative to its working
directory (a module names its own files through `path.module`), and refuse any path that leaves the
checkout the engine was given. `timestamp()`, `uuid()` and `bcrypt()` are unknown
until apply, as in Terraform (and `plantimestamp()`, unlike Terraform: see its comment).
"""

from gateway.adapters.sandbox.functions import (  # noqa: F401  (each module registers its functions on import)
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
from gateway.adapters.sandbox.functions.conversion import issensitive, sensitive
from gateway.adapters.sandbox.functions.registry import (
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
