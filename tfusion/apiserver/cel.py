"""The CEL engine the embedded API server evaluates expressions with: compiling, a metered
evaluator, and JSON values converted as kube converts them.

Two callers use it: CRD validation rules (`x-kubernetes-validations`, crd_rules.py) and
ValidatingAdmissionPolicy expressions (policies.py), each with its own variables.

The CEL engine is cel-python (`celpy`): a pure-Python interpreter of the CEL spec (macros, has(),
string functions, regular expressions through RE2, heterogeneous lists and maps). It parses but does
not type-check, so our compile step adds what kube's checker reports most often: syntax errors and
references to variables other than the declared ones and macro variables. Type errors (a string
compared with an int, a field the schema does not have) surface at evaluation as
"... evaluating rule: ..." errors, which kube would already report at CRD creation.

Bound: kube charges a cost per CEL operation (1,000,000 per expression, 10,000,000 per object).
Validation here runs inside the store's atomic write step on the event loop, so it cannot be moved
to a thread and awaited; instead every AST node the interpreter visits costs one step, with at most
`RULE_STEP_LIMIT` steps per rule evaluation and `OBJECT_STEP_BUDGET` steps for all rules of one
object. At about 10 µs a step (cel-python is an AST interpreter) that caps one write's CEL time near
a second whatever the rule or the list size; a macro over a list costs about 17 steps an item, so
`self.all(x, x > 0)` fits lists of about 2,500 items. Converting the JSON to CEL values is not
metered: it is linear and cheap (under a microsecond a value, about a second for a 3 MiB body of
small numbers).

Where cel-python departs from cel-go on something policies lean on, evaluation follows cel-go: a
map or a list compared with null is simply unequal (`oldObject != null`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import Evaluator, bool_eq, bool_ne

RULE_STEP_LIMIT: Final = 50_000
OBJECT_STEP_BUDGET: Final = 100_000
#: the interpreter recurses a few Python frames per AST level and an expression about 50 parentheses
#: deep already exhausts Python's stack at evaluation; each parenthesis costs about ten levels, so this
#: allows some twenty nested parentheses, and ordinary rules stay under 40 levels
MAX_AST_DEPTH: Final = 250
_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: names CEL resolves without a declaration (type values usable in `type(x) == int`)
_BUILTIN_NAMES: Final = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn"}
)

Schema = dict[str, Any]
Ast = lark.Tree[Any]

_environment: celpy.Environment | None = None


def _env() -> celpy.Environment:
    global _environment
    if _environment is None:
        _environment = celpy.Environment()
    return _environment


# ------------------------------------------------------------------------------ compiling
class CompileError(Exception):
    pass


#: the variables of a CRD validation rule
RULE_VARIABLES: Final = frozenset({"self", "oldSelf"})


def compile_expression(text: str, declared: frozenset[str] = RULE_VARIABLES) -> tuple[Ast, bool]:
    """Parse `text` and check that it reads only `declared` variables (and macro variables);
    returns the AST and whether it uses `oldSelf`."""
    try:
        ast = _env().compile(text)
    except Exception as exc:  # celpy raises CELParseError and lark errors alike for bad syntax
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        where = f" at line {line}, column {column + 1}" if isinstance(line, int) and isinstance(column, int) else ""
        shown = " ".join(str(exc).split())
        raise CompileError(f"syntax error{where}: {shown}") from None
    depth = _depth(ast)
    if depth > MAX_AST_DEPTH:
        raise CompileError(f"expression nests {depth} levels deep, at most {MAX_AST_DEPTH} are allowed")
    names = _identifiers(ast)
    bound = _macro_variables(ast)
    for name in names:
        if name not in bound and name not in _BUILTIN_NAMES and name not in declared:
            raise CompileError(f"undeclared reference to '{name}' (in container '')")
    return ast, "oldSelf" in names and "oldSelf" not in bound


def _depth(ast: Ast) -> int:
    """How deep the tree is (without recursing: it is the recursion this bounds)."""
    deepest, stack = 0, [(ast, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in node.children if isinstance(child, lark.Tree))
    return deepest


def _identifiers(ast: Ast) -> list[str]:
    return [str(node.children[0]) for node in ast.iter_subtrees() if node.data == "ident" and node.children]


def _macro_variables(ast: Ast) -> set[str]:
    bound: set[str] = set()
    for node in ast.iter_subtrees():
        if node.data != "member_dot_arg" or len(node.children) < 3 or str(node.children[1]) not in _MACROS:
            continue
        arguments = node.children[2]
        if isinstance(arguments, lark.Tree) and arguments.children and isinstance(arguments.children[0], lark.Tree):
            bound.update(_identifiers(arguments.children[0]))
    return bound


# ------------------------------------------------------------------------------ evaluating
class OutOfSteps(BaseException):
    """Raised from inside the interpreter; a BaseException so that celpy's own error capture
    (which turns `Exception`s into CEL error values) cannot swallow it."""

    def __init__(self, per_rule: bool) -> None:
        super().__init__()
        self.per_rule = per_rule


@dataclass
class StepMeter:
    remaining: int = OBJECT_STEP_BUDGET
    rule_limit: int = RULE_STEP_LIMIT
    rule_steps: int = 0

    def step(self) -> None:
        self.rule_steps += 1
        self.remaining -= 1
        if self.rule_steps > self.rule_limit:
            raise OutOfSteps(per_rule=True)
        if self.remaining < 0:
            raise OutOfSteps(per_rule=False)


class _MeteredEvaluator(Evaluator):
    """celpy's tree-walking interpreter, charging one step per AST node visited (macros included)."""

    def __init__(self, ast: Ast, activation: Any, meter: StepMeter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def _visit_tree(self, tree: Ast) -> Any:
        self.meter.step()
        return super()._visit_tree(tree)

    def sub_evaluator(self, ast: Ast) -> Evaluator:
        return _MeteredEvaluator(ast, self.activation, self.meter)


def _not_equal(a: Any, b: Any) -> Any:
    """`!=` as cel-go has it: anything but null differs from null (celpy finds no overload for a map or
    a list against null, which breaks the common `oldObject != null`)."""
    if (a is None) != (b is None):
        return _TRUE
    return bool_ne(a, b)


def _equal(a: Any, b: Any) -> Any:
    if (a is None) != (b is None):
        return _FALSE
    return bool_eq(a, b)


_NULL_AWARE: Final = {"_!=_": _not_equal, "_==_": _equal}


def evaluate(ast: Ast, variables: dict[str, Any], meter: StepMeter) -> Any:
    """Evaluate a compiled expression; raises CELEvalError for CEL errors, OutOfSteps past the bound."""
    meter.rule_steps = 0
    activation = _env().program(ast, functions=_NULL_AWARE).new_activation()
    return _MeteredEvaluator(ast, activation, meter).evaluate(variables)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_TRUE, _FALSE = celtypes.BoolType(True), celtypes.BoolType(False)


def to_cel(value: Any, schema: Schema | None) -> Any:
    """A JSON value as the CEL value kube builds for it from the schema.

    The celtypes constructors are bypassed for plain JSON values: they re-check and re-wrap every
    value and would make converting a large list cost more than evaluating a rule on it.
    """
    schema = schema or {}
    kind = schema.get("type")
    if value is None:
        return None
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        if kind == "number":
            return float.__new__(celtypes.DoubleType, value)
        return int.__new__(celtypes.IntType, value) if _INT64_MIN <= value <= _INT64_MAX else celtypes.IntType(value)
    if isinstance(value, float):
        if kind == "integer" and value.is_integer():
            return to_cel(int(value), schema)
        return float.__new__(celtypes.DoubleType, value)
    if isinstance(value, str):
        return str.__new__(celtypes.StringType, value)
    if isinstance(value, list):
        items = schema.get("items")
        item_schema = items if isinstance(items, dict) else None
        return celtypes.ListType([to_cel(item, item_schema) for item in value])
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        values_schema = additional if isinstance(additional, dict) else None
        converted = celtypes.MapType()
        dict.update(
            converted,
            {
                str.__new__(celtypes.StringType, key): to_cel(item, properties.get(key) or values_schema)
                for key, item in value.items()
            },
        )
        return converted
    return value
