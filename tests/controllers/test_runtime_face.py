"""The controller runtime's public face (`orchestrator.controllers.runtime`): every name it
lists resolves, its type-checking imports and its lazy table agree, and an HTTPS-only user
(the standalone agent) does not load the in-process client or the API server through it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import orchestrator.controllers.runtime as runtime

ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_name_resolves() -> None:
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name
    assert {"Client", "Controller", "Result", "SharedInformer", "ControllerManager"} <= set(
        runtime.__all__
    )


def test_type_checking_imports_match_the_lazy_table() -> None:
    tree = ast.parse(Path(runtime.__file__).read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                for alias in stmt.names:
                    assert alias.asname == alias.name  # `X as X`: an explicit re-export
                    typed[alias.name] = stmt.module or ""
    assert sorted(typed) == runtime.__all__
    for name, module in typed.items():
        assert runtime._MODULE_OF[name] == module, name


def test_an_http_only_user_does_not_load_the_api_server() -> None:
    code = """
import json, sys
from orchestrator.controllers.runtime import Client, Controller, HttpClient, SharedInformer
print(json.dumps(sorted(m for m in sys.modules if m.startswith((
    "orchestrator.apiserver", "orchestrator.controllers.runtime.inprocess",
    "orchestrator.controllers.runtime.manager", "orchestrator.security")))))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
