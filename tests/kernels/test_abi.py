"""kernels/abi.py declares every function of csrc/kernels.h, with the header's argument
count and types, and every loaded variant gets those declarations."""

from __future__ import annotations

import ctypes
import re
from typing import Any

import pytest

from pagedllm.kernels import abi, build

HEADER = (build.CSRC / "kernels.h").read_text()
_C_TYPES = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "float": ctypes.c_float,
}


def _c_argument_types(parameters: str) -> list[type]:
    """ctypes types of a C parameter list: pointers are void pointers in abi.py."""
    parameters = " ".join(parameters.replace("\\", " ").split())
    if parameters in ("", "void"):
        return []
    types = []
    for parameter in parameters.split(","):
        words = parameter.replace("*", " * ").split()
        types.append(ctypes.c_void_p if "*" in words else _C_TYPES[words[-2]])
    return types


def _header_functions() -> dict[str, list[type]]:
    """Every PAGEDLLM_API function of the header (the DECLARE_ macros expanded)."""
    functions = {}
    macros = dict(re.findall(r"#define (DECLARE_\w+)\(NAME, T\)(.*?)\n\n", HEADER, re.S))
    for macro, body in macros.items():
        parameters = re.search(r"NAME\((.*?)\);", body, re.S).group(1)  # type: ignore[union-attr]
        for name, element in re.findall(rf"{macro}\((\w+), (\w+)\)", HEADER):
            if name != "NAME":  # the macro's own definition
                functions[name] = _c_argument_types(parameters.replace("T *", f"{element} *"))
    for name, parameters in re.findall(
        r"PAGEDLLM_API [\w\s\*]+?\b(\w+)\(([^)]*)\);", HEADER.replace("\\\n", "")
    ):
        if name != "NAME":
            functions[name] = _c_argument_types(parameters)
    return functions


def test_abi_declares_every_header_function_with_its_types():
    header = _header_functions()
    declared = {f.name: list(f.argtypes) for f in abi.FUNCTIONS}
    assert set(declared) == set(header)
    assert len(header) >= 17
    for name, types in header.items():
        assert declared[name] == types, name


def _header_fields(name: str) -> list[tuple[str, Any]]:
    """The (name, ctypes type) of each field of the header's struct `name`, in order: a
    pointer as abi.py declares them (a void pointer), an array as its element's type times
    its length, a struct as abi.py's class of that name."""
    body = re.search(r"typedef struct \{([^{}]*)\} " + name + ";", HEADER).group(1)  # type: ignore[union-attr]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields: list[tuple[str, Any]] = []
    for declaration in filter(str.strip, body.split(";")):
        words = declaration.replace("const ", " ").split(None, 1)
        base = _C_TYPES.get(words[0]) or getattr(abi, words[0], None)
        # "int64_t a, b" / "const uint16_t *a, *b" / "StackWeight parts[2]"
        for declarator in words[1].split(","):
            match = re.fullmatch(r"\s*(\*?)\s*(\w+)(?:\[(\d+)\])?\s*", declarator)
            assert match, declarator
            pointer, field, length = match.groups()
            kind = ctypes.c_void_p if pointer else base
            assert kind is not None, (name, declaration)
            fields.append((field, kind * int(length) if length else kind))
    return fields


@pytest.mark.parametrize("struct", [
    abi.PagedDims, abi.StackDims, abi.StackWeight, abi.StackMatrix, abi.StackMoE, abi.StackLayer,
    abi.StackGroup, abi.StackPrefills, abi.StackLoRA, abi.StackLoRAStep,
])
def test_structs_have_the_header_fields_in_order_with_their_types(struct):
    """Names, order and types (so sizes and offsets) as the header declares them: a
    field of another type or order would read another field's bytes in C."""
    assert list(struct._fields_) == _header_fields(struct.__name__)


def test_loaded_library_carries_the_declarations():
    from pagedllm.platform import current_platform

    library = current_platform().kernel_library()
    if library is None:
        pytest.skip("no C compiler here")
    for function in abi.FUNCTIONS:
        handle = getattr(library.lib, function.name)
        assert handle.restype is function.restype
        assert tuple(handle.argtypes or ()) == function.argtypes
