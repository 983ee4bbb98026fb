"""Forward-mode derivatives by source transformation: a score_mod rewritten into plain Python that returns
``(value, d value / d score)``, which numba compiles into a kernel as it compiles the score_mod itself.

The NumPy stages take d score_mod / d score from dual numbers (``tinyflash.core.dual``): the user's function is
called with a :class:`~tinyflash.core.dual.Dual`, whose operators carry the derivative along. A GPU kernel cannot
do that: numba compiles scalars, arrays and tuples, not a Python class with operator methods. Three ways were open:

* numba extension types for a dual number on the CUDA target: a type, its data model, and a typing and a lowering
  rule for every operator and every ``math`` function, written against numba's internals; and the simulator, which
  runs plain Python, would run the Dual class instead, so the two paths would differ;
* a derivative the caller writes and passes: a second function to keep in step with the first, and nothing to
  check that it is the derivative of that function;
* a source transformation (this module): the function's own syntax tree, rewritten once on the host into a
  function of the same scalars that computes the value and the derivative side by side. The result is plain
  Python in the subset numba compiles (arithmetic, comparisons, ``math``, tuples), so the GPU compiles it and
  the simulator runs it, the same code. The value lines are the user's own expressions, operation by operation
  in the same order on the same types, so the value is bit for bit the score the forward kernel computes.

How it rewrites. ``score`` (the first parameter) is *active*, and so is every variable assigned from an active
expression. Each active expression becomes temporaries, one per operation: ``_tf_1 = a * b`` (the value, the
user's operation) and ``_tf_1d = a_d * b + a * b_d`` (the product rule), ``d_x`` beside each active variable
``x``. Inactive expressions (the indices, captured tables, constants) are left exactly as written. The rules:

    a ± b, a · b, a / b, a ** b    the sum, product, quotient and power rules
    -a, +a, a % c                  the derivative's sign; a % c has a's derivative (c inactive)
    a // c, comparisons            piecewise constant: derivative 0 (no longer active)
    x if c else y                  the branch taken (an ``if``, so the other branch is not evaluated)
    min, max, abs                  the derivative of the argument chosen, sign(a) · a' for abs
    math.f(a)                      f'(a) · a' for exp, expm1, exp2, log, log1p, log2, log10, sqrt, tanh, sinh,
                                   cosh, sin, cos, tan, atan, asin, acos, erf, fabs, pow; floor, ceil, trunc: 0
    float(a), numpy.float32(a)     the same conversion of the derivative
    helper(a, ...)                 another plain function (or a numba dispatcher's), rewritten the same way
                                   with its active parameters: it returns (value, derivative)
    if / else, assignments, return statements; any statement that touches no active value is kept as written

Anything else that touches the score (a loop over it, a table indexed by it, ``and``/``or`` of numbers) is a
TypeError naming ``score_mod``, before anything is compiled. The derivative's constants are float32 (the
kernels' scores are float32), and the derivative is returned as float32. The source is read from the
function's file (``inspect``): a function made by ``exec`` without a file has none to read, which is a TypeError too.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import math
import types

import numpy as np

PREFIX = "_tf_"  # the names this module adds; a function that uses such names is refused
# d f(a) / d a, with ``a`` the argument's value and ``y`` f(a) (computed once, for the value), in float32 constants
RULES = {
    "exp": "y", "expm1": "y + _tf_f32(1.0)", "exp2": "y * _tf_f32(0.6931471805599453)",
    "log": "_tf_f32(1.0) / a", "log1p": "_tf_f32(1.0) / (_tf_f32(1.0) + a)",
    "log2": "_tf_f32(1.0) / (a * _tf_f32(0.6931471805599453))",
    "log10": "_tf_f32(1.0) / (a * _tf_f32(2.302585092994046))",
    "sqrt": "_tf_f32(0.5) / y", "tanh": "_tf_f32(1.0) - y * y", "sinh": "_tf_math.cosh(a)", "cosh": "_tf_math.sinh(a)",
    "sin": "_tf_math.cos(a)", "cos": "-_tf_math.sin(a)", "tan": "_tf_f32(1.0) + y * y",
    "atan": "_tf_f32(1.0) / (_tf_f32(1.0) + a * a)", "asin": "_tf_f32(1.0) / _tf_math.sqrt(_tf_f32(1.0) - a * a)",
    "acos": "-_tf_f32(1.0) / _tf_math.sqrt(_tf_f32(1.0) - a * a)",
    "erf": "_tf_f32(1.1283791670955126) * _tf_math.exp(-(a * a))",
    "fabs": "(_tf_f32(1.0) if a > 0 else (-_tf_f32(1.0) if a < 0 else _tf_f32(0.0)))",
}
STEPS = ("floor", "ceil", "trunc")  # piecewise constant: derivative 0
CASTS = {float, np.float32, np.float64}


def value_and_derivative(fn, who: str = "score_mod", device=None):
    """``fn(score, *rest) -> value`` rewritten into ``(score, *rest) -> (value, float32 d value / d score)``.

    ``device``: how a kernel compiles a function that another calls (numba's ``cuda.jit(device=True)``: a kernel
    calls device functions only), applied to the rewritten helpers; None leaves them plain Python."""
    return _transform(fn, (0,), who, 0, device, seeded=True)


def _transform(fn, active_params: tuple, who: str, depth: int, device=None, seeded: bool = False):
    """``fn`` rewritten with the parameters at ``active_params`` active: each becomes two, its value and its
    derivative, and the function returns (value, derivative); ``seeded``: the active parameters' derivatives are
    1 (d score / d score), not parameters."""
    fn = getattr(fn, "py_func", fn)  # a numba dispatcher: its Python function
    if depth > 8 or not isinstance(fn, types.FunctionType):
        raise TypeError(f"{who}: cannot take the derivative of {fn!r} (a plain Python function is needed)")
    node = _function_node(fn, who)
    args = node.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise TypeError(f"{who}: {fn.__name__} must take positional parameters only for its derivative")
    params = [a.arg for a in args.args]
    namespace = dict(fn.__globals__)
    namespace.update({name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())})
    namespace.update({"_tf_math": math, "_tf_f32": np.float32, "_tf_zero": np.float32(0.0)})
    body = [ast.Return(node.body)] if isinstance(node, ast.Lambda) else node.body
    rewriter = _Rewriter({params[i] for i in active_params}, namespace, who, fn.__name__, depth, device)
    new_params = []
    for i, name in enumerate(params):
        new_params += [name, f"d_{name}"] if i in active_params and not seeded else [name]
    seeds = [ast.Assign([ast.Name(f"d_{params[i]}", ast.Store())], _parse("_tf_f32(1.0)")) for i in active_params]
    statements = (seeds if seeded else []) + rewriter.block(body)
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    clash = sorted(n for n in names if n.startswith("d_") and n[2:] in rewriter.active)
    if clash:
        raise TypeError(f"{who}: {fn.__name__} uses the name {clash[0]}, which the derivative of {clash[0][2:]} takes")
    if not _ends(statements):  # falling off the end returns None
        statements.append(ast.Return(ast.Tuple([ast.Constant(None), ast.Name("_tf_zero")], ast.Load())))
    name = f"{fn.__name__ if fn.__name__.isidentifier() else 'mod'}_value_and_derivative"
    tree = ast.Module([ast.FunctionDef(name, ast.arguments([], [ast.arg(p) for p in new_params], None, [], [], None,
                                                           []), statements, [], None)], [])
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    filename = f"<{name} of {fn.__code__.co_filename}:{fn.__code__.co_firstlineno}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    exec(compile(source, filename, "exec"), namespace)
    made = namespace[name]
    made.__defaults__ = fn.__defaults__
    return made


def _ends(statements: list) -> bool:
    """Whether a block always returns: its last statement is a return, or an if whose branches both do."""
    last = statements[-1] if statements else None
    return isinstance(last, ast.Return) or (isinstance(last, ast.If) and _ends(last.body) and _ends(last.orelse))


def _function_node(fn, who: str):
    """The syntax tree of ``fn`` (a def or a lambda) from its file: the node that starts on its first line with
    its parameters (and, among several lambdas there, the one whose names match its code's)."""
    code = fn.__code__
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    if not lines:
        raise TypeError(f"{who}: the source of {fn.__name__} is needed for its derivative on the GPU and cannot be "
                        f"read ({code.co_filename}); define it in a file")
    tree = ast.parse("".join(lines))
    params = list(code.co_varnames[:code.co_argcount])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            if first == code.co_firstlineno and [a.arg for a in node.args.args] == params and (
                    isinstance(node, ast.Lambda) or node.name == fn.__name__):
                found.append(node)
    if len(found) > 1:  # two lambdas on one line with the same parameters: the one that names what the code names
        names = set(code.co_names) | set(code.co_freevars)  # globals, attributes and captured names it reads
        found = [n for n in found if _outside_names(n, params) <= names <= _outside_names(n, params) | {
            x.attr for x in ast.walk(n) if isinstance(x, ast.Attribute)}]
    if len(found) != 1:
        raise TypeError(f"{who}: cannot find the source of {fn.__name__} in {code.co_filename}, line "
                        f"{code.co_firstlineno}, for its derivative on the GPU")
    node = found[0]
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []
    for inner in ast.walk(node):
        if inner is not node and isinstance(inner, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
            raise TypeError(f"{who}: {fn.__name__} defines a function inside; not supported for its derivative")
        if isinstance(inner, ast.Name) and inner.id.startswith(PREFIX):
            raise TypeError(f"{who}: {fn.__name__} uses the name {inner.id}, which the derivative reserves")
    return node


def _outside_names(node, params) -> set:
    """The names a function's node reads that are not its parameters."""
    return {x.id for x in ast.walk(node) if isinstance(x, ast.Name)} - set(params)


def _names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _parse(text: str, **values):
    """An expression from ``text`` with its names in ``values`` replaced by those expressions."""
    tree = ast.parse(text, mode="eval").body

    class Put(ast.NodeTransformer):
        def visit_Name(self, node):
            return values.get(node.id, node)

    return Put().visit(tree)


class _Rewriter:
    """The rewriting of one function's body (module docstring): ``block`` returns its new statements."""

    def __init__(self, active: set, namespace: dict, who: str, name: str, depth: int, device):
        self.active, self.namespace, self.who, self.name, self.depth = set(active), namespace, who, name, depth
        self.device = device
        self.count, self.out = 0, []

    def fail(self, node, what: str):
        raise TypeError(f"{self.who}: {what} in {self.name} (line {getattr(node, 'lineno', '?')}) is not supported "
                        "for the derivative on the GPU (tinyflash.core.dual_source lists what is)")

    def touches(self, node) -> bool:
        return bool(_names(node) & self.active)

    def temp(self):
        self.count += 1
        return f"{PREFIX}{self.count}"

    def emit(self, target: str, value) -> ast.Name:
        self.out.append(ast.Assign([ast.Name(target, ast.Store())], value))
        return ast.Name(target, ast.Load())

    # --- statements ------------------------------------------------------------------------------------------

    def block(self, statements: list) -> list:
        self._find_active(statements)
        saved, self.out = self.out, []
        for statement in statements:
            self.statement(statement)
        made, self.out = self.out, saved
        return made

    def _find_active(self, statements):
        """Every variable assigned an active expression, anywhere in the body, until nothing changes."""
        while True:
            before = len(self.active)
            for node in (n for s in statements for n in ast.walk(s)):
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if self.is_active(node.value) or (isinstance(node, ast.AugAssign) and self.touches(node.target)):
                        self.active |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if len(self.active) == before:
                return

    def statement(self, node):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring
        if isinstance(node, ast.AugAssign):
            node = ast.Assign([node.target], ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value),
                              lineno=node.lineno) if isinstance(node.target, ast.Name) else node
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            node = ast.Assign([node.target], node.value, lineno=node.lineno)
        if isinstance(node, ast.Return):
            value, der = self.expression(node.value) if node.value is not None else (ast.Constant(None), None)
            der = ast.Call(ast.Name("_tf_f32"), [der], []) if der is not None else ast.Name("_tf_zero")
            self.out.append(ast.Return(ast.Tuple([value, der], ast.Load())))
        elif isinstance(node, ast.If):
            if self.is_active(node.test):
                self.fail(node, "a condition on an active number")
            self.out.append(ast.If(node.test, self.block(node.body) or [ast.Pass()], self.block(node.orelse)))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value, der = self.expression(node.value)
            self.emit(name, value)
            if name in self.active:
                self.emit(f"d_{name}", der if der is not None else ast.Name("_tf_zero"))
        elif isinstance(node, ast.Pass) or not self.touches(node):
            self.out.append(node)  # touches nothing active: kept as written
        else:
            self.fail(node, f"a {type(node).__name__} statement on an active number")

    # --- expressions -----------------------------------------------------------------------------------------

    def is_active(self, node) -> bool:
        """Whether an expression's value depends on the score (comparisons and floor divisions do not)."""
        if isinstance(node, ast.Name):
            return node.id in self.active
        if isinstance(node, (ast.Compare, ast.BoolOp)) or (isinstance(node, ast.UnaryOp) and isinstance(
                node.op, ast.Not)) or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)):
            return False
        if isinstance(node, ast.Call) and self.math_name(node.func) in STEPS:
            return False
        return any(self.is_active(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))

    def math_name(self, func):
        """'tanh' for ``math.tanh`` or a name bound to math.tanh in the function's namespace; else None."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if self.namespace.get(func.value.id) is math:
                return func.attr
        if isinstance(func, ast.Name):
            value = self.namespace.get(func.id)
            for name in (*RULES, *STEPS, "pow"):
                if value is getattr(math, name):
                    return name
        return None

    def expression(self, node):
        """(the value, as the user wrote it, and the derivative: an expression, or None where it is 0)."""
        if not self.is_active(node):
            if self.touches(node):  # a comparison of active numbers: its operands' values, as written
                self.check_inactive_use(node)
            return node, None
        if isinstance(node, ast.Name):
            return node, ast.Name(f"d_{node.id}", ast.Load())
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value, der = self.expression(node.operand)
            out = self.emit(self.temp(), ast.UnaryOp(node.op, value))
            return out, ast.UnaryOp(node.op, der)
        if isinstance(node, ast.IfExp):
            return self.choice(node)
        if isinstance(node, ast.Call) and not node.keywords:
            return self.call(node)
        self.fail(node, f"a {type(node).__name__} of an active number")

    def check_inactive_use(self, node):
        """Active numbers may be compared (their values, as written); an index or an and/or's value made of them is
        refused."""
        for inner in ast.walk(node):
            if isinstance(inner, ast.Subscript) and self.touches(inner.slice):
                self.fail(inner, "an index computed from the score")
            if isinstance(inner, ast.BoolOp) and any(self.is_active(value) for value in inner.values):
                self.fail(inner, "an and/or whose value may be an active number")

    def binary(self, node):
        (a, da), (b, db) = self.expression(node.left), self.expression(node.right)
        out = self.emit(self.temp(), ast.BinOp(a, node.op, b))
        op = type(node.op)
        if op is ast.Add:
            der = da if db is None else db if da is None else _parse("da + db", da=da, db=db)
        elif op is ast.Sub:
            der = da if db is None else _parse("-db", db=db) if da is None else _parse("da - db", da=da, db=db)
        elif op is ast.Mult:
            terms = [_parse("da * b", da=da, b=b)] if da is not None else []
            terms += [_parse("a * db", a=a, db=db)] if db is not None else []
            der = terms[0] if len(terms) == 1 else _parse("x + y", x=terms[0], y=terms[1])
        elif op is ast.Div:
            der = (_parse("da / b", da=da, b=b) if db is None else _parse("-(a * db) / (b * b)", a=a, b=b, db=db)
                   if da is None else _parse("(da * b - a * db) / (b * b)", a=a, b=b, da=da, db=db))
        elif op is ast.Pow:
            left = _parse("b * a ** (b - 1) * da", a=a, b=b, da=da) if da is not None else None
            right = _parse("y * _tf_math.log(a) * db", y=out, a=a, db=db) if db is not None else None
            der = left if right is None else right if left is None else _parse("x + y", x=left, y=right)
        elif op is ast.Mod and db is None:
            der = da
        else:
            self.fail(node, f"the operator {type(node.op).__name__} on an active number")
        return out, self.emit(self.temp() + "d", der)

    def choice(self, node):
        """``x if c else y`` as an if statement: only the branch taken is evaluated, value and derivative."""
        test = self.expression(node.test)[0]
        target = self.temp()
        branches = []
        for branch in (node.body, node.orelse):
            saved, self.out = self.out, []
            value, der = self.expression(branch)
            self.emit(target, value)
            self.emit(target + "d", der if der is not None else ast.Name("_tf_zero"))
            branches.append(self.out)
            self.out = saved
        self.out.append(ast.If(test, branches[0], branches[1]))
        return ast.Name(target, ast.Load()), ast.Name(target + "d", ast.Load())

    def call(self, node):
        func, parts = node.func, [self.expression(arg) for arg in node.args]
        values = [v for v, _ in parts]
        call = ast.Call(func, values, [])
        builtin = func.id if isinstance(func, ast.Name) and func.id not in self.namespace else None
        name = self.math_name(func)
        if builtin in ("min", "max") and len(parts) >= 2:
            out, der = parts[0]
            for value, d in parts[1:]:  # max(a, b) is b where b > a, else a (min: b < a): Python's choice
                test = ast.Compare(value, [ast.Gt() if builtin == "max" else ast.Lt()], [out])
                out = self.emit(self.temp(), ast.Call(ast.Name(builtin), [out, value], []))
                der = self.emit(self.temp() + "d", ast.IfExp(test, d or ast.Name("_tf_zero"),
                                                             der or ast.Name("_tf_zero")))
            return out, der
        if builtin == "abs" and len(parts) == 1:
            name = "fabs"
        if name in RULES and len(parts) == 1:
            out = self.emit(self.temp(), call)
            rule = _parse(RULES[name], a=values[0], y=out)
            return out, self.emit(self.temp() + "d", _parse("r * da", r=rule, da=parts[0][1]))
        if name == "pow" and len(parts) == 2:
            return self.binary(ast.BinOp(node.args[0], ast.Pow(), node.args[1], lineno=node.lineno))
        target = self.namespace.get(func.id) if isinstance(func, ast.Name) else None
        if (builtin == "float" or any(target is cast for cast in CASTS)) and len(parts) == 1:
            return self.emit(self.temp(), call), self.emit(self.temp() + "d", ast.Call(func, [parts[0][1]], []))
        if isinstance(target, types.FunctionType) or hasattr(target, "py_func"):
            return self.helper(node, target, parts)
        self.fail(node, f"the call {ast.unparse(func)}(...) of an active number")

    def helper(self, node, target, parts):
        """Another user function, rewritten with its active parameters: ``value, d = helper_dual(...)``."""
        active = tuple(i for i, (_, d) in enumerate(parts) if d is not None)
        dual = _transform(target, active, self.who, self.depth + 1, self.device)
        key = self.temp()
        self.namespace[key + "fn"] = dual if self.device is None else self.device(dual)
        args = [x for v, d in parts for x in ((v, d) if d is not None else (v,))]
        out, der = self.temp(), self.temp() + "d"
        self.out.append(ast.Assign([ast.Tuple([ast.Name(out, ast.Store()), ast.Name(der, ast.Store())], ast.Store())],
                                   ast.Call(ast.Name(key + "fn"), args, [])))
        return ast.Name(out, ast.Load()), ast.Name(der, ast.Load())
