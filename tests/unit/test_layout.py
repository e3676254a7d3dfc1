"""The rooms stay apart: the library imports no role, roles import no tooling, and no project module imports itself
back through others."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("freshroute", "pipeline", "store_node", "router", "proto", "loadtest", "tools")
ROLES = ("pipeline", "store_node", "router")
TOOLING = ("tools", "loadtest")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports() -> dict[str, set[str]]:
    """Every project module → the project modules it imports (anywhere in it, typing-only imports included)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                # The deepest project module the import names.
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    deps.add(t)
        graph[name] = deps
    return graph


def test_the_library_imports_no_role_and_no_tooling():
    # freshroute/ is what clients install and every role shares: it stands on its own.
    bad = sorted((m, d) for m, deps in project_imports().items() if m.split(".")[0] == "freshroute"
                 for d in deps if d.split(".")[0] in ROLES + TOOLING)
    assert bad == []


def test_roles_import_no_tooling():
    # A role starts through the library's launcher (freshroute.launch): `python -m router` needs no tools.
    bad = sorted((m, d) for m, deps in project_imports().items() if m.split(".")[0] in ROLES
                 for d in deps if d.split(".")[0] in TOOLING)
    assert bad == []


def test_the_tools_stand_on_top():
    # The benchmarks use the local stack; the tools run the benchmarks as a program of their own, never import them.
    bad = sorted((m, d) for m, deps in project_imports().items() if m.split(".")[0] == "tools"
                 for d in deps if d.split(".")[0] == "loadtest")
    assert bad == []


def test_no_import_cycles():
    graph = project_imports()
    cycles = set()

    def visit(m: str, path: list[str]) -> None:
        for d in graph.get(m, ()):
            if d in path:
                cycles.add(" → ".join(path[path.index(d):] + [d]))
            elif len(path) < 12:
                visit(d, path + [d])

    for m in graph:
        visit(m, [m])
    assert sorted(cycles) == []


def test_transports_know_the_router_only_through_their_interface():
    # Protocol code only: the rest of the router reaches them, never the other way round.
    bad = sorted((m, d) for m, deps in project_imports().items() if m.startswith("router.transports")
                 for d in deps if d.startswith(("router", "freshroute.routing")) and not d.startswith("router.transports"))
    assert bad == []


def test_the_store_node_reads_its_wire_not_the_routers_client():
    # Both ends of the read port speak freshroute.wire; the store node loads nothing of the routing that reads it.
    graph = project_imports()
    bad = sorted((m, d) for m, deps in graph.items() if m.startswith("store_node")
                 for d in deps if d.startswith(("freshroute.routing", "freshroute.client")))
    assert bad == []
    assert "freshroute.wire" in graph["store_node.read_port"] and "freshroute.wire" in graph["freshroute.routing.store"]
    assert not {d for d in graph["freshroute.wire"] if d.startswith(("freshroute.routing", "freshroute.client"))}


def test_no_class_of_a_role_or_the_library_is_over_300_lines():
    # A class that long does several things; the roles' and the library's code is read most, so there it is split.
    long = sorted((str(p.relative_to(ROOT)), n.name, n.end_lineno - n.lineno + 1)
                  for package in (*ROLES, "freshroute") for p in (ROOT / package).rglob("*.py")
                  for n in ast.walk(ast.parse(p.read_text(), str(p)))
                  if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > 300)
    assert long == []


def test_no_module_of_a_role_or_the_library_is_over_450_lines():
    # Each module holds one idea, read call by call when a lookup or a restore is traced; protoc's are generated.
    long = sorted((str(p.relative_to(ROOT)), n) for package in (*ROLES, "freshroute")
                  for p in (ROOT / package).rglob("*.py") if (n := len(p.read_text().splitlines())) > 450)
    assert long == []


def test_the_client_loads_neither_the_routers_stubs_nor_grpc():
    # The light client reads store nodes and routers over their own wires: gRPC is the server's, not its install's.
    code = ("import sys, freshroute.client\n"
            "print(sorted(m for m in sys.modules if m.startswith(('grpc', 'proto.router'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_no_test_module_imports_another():
    # Shared fixtures live in conftest or support modules: a test module is read, run and moved on its own.
    importing = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                       for n in ast.walk(ast.parse(p.read_text(), str(p)))
                       if isinstance(n, ast.ImportFrom) and n.module
                       and n.module.rpartition(".")[2].startswith("test_"))
    assert importing == []
