"""The tool environment's executors: the safe calculator and the Python sandbox."""

from __future__ import annotations

import os
import time
from fractions import Fraction

import pytest

from rlvr.envs.multiturn.tools import Calculator, PythonSandbox, bwrap_available, format_number
from rlvr.errors import CalculatorError

# ------------------------------------------------------------------------------------ calculator


@pytest.mark.parametrize(
    ("expression", "expected"),
    [("412*37", "15244"), ("2**10 / 4", "256"), ("1/3*3", "1"), ("7/2", "3.5"), ("1/3", "0.333333333333333"),
     ("-2**2", "-4"), ("(-2)**2", "4"), ("2**-3", "0.125"), ("17 // 5", "3"), ("17 % 5", "2"), ("-7 // 2", "-4"),
     ("0.1 + 0.2", "0.3"), ("1.5 * 2", "3"), ("sqrt(16)", "4"), ("sqrt(9/4)", "1.5"), ("sqrt(2)", "1.4142135623731"),
     ("abs(-3)", "3"), ("round(2.567, 2)", "2.57"), ("round(7/2)", "4"), ("min(3, 1, 2)", "1"), ("max(3, 1/2)", "3"),
     ("pi", "3.14159265358979"), (" 2 * (3 + 4) ", "14"), ("10**30", "1" + "0" * 30), ("1/1024", "0.0009765625")],
)
def test_calculator_values(expression, expected):
    assert Calculator()(expression) == expected


@pytest.mark.parametrize(
    ("expression", "match"),
    [("9**9**9", "too large"), ("2**10**10", "too large"), ("10**5000", "too large"), ("(10**1000)**10", "too large"),
     ("(2**4000)*(2**4000)", "too large"), ("9" * 2000, "longer than"), ("2.0**100000", "too large"),
     ("1e308 * 10", "not finite"), ("(-8) ** 0.5", "complex"), ("2 ^ 3", r"write \*\*"),
     ("__import__('os').system('true')", "not allowed"), ("().__class__.__bases__", "Attribute"),
     ("x + 1", "name 'x'"), ("open('f')", "not allowed"), ("(lambda: 1)()", "not allowed"), ("[1, 2]", "List"),
     ("'a' * 10", "only numbers"), ("True + 1", "only numbers"), ("1 if 1 else 2", "IfExp"),
     ("abs(x=1)", "keyword"), ("-" * 300 + "1", "nested deeper"), ("(1+" * 100 + "1" + ")" * 100, "nested deeper"),
     ("(" * 300 + "1" + ")" * 300, "longer than"), ("sqrt(-1)", "negative"), ("", "empty"),
     ("1 +", "invalid syntax"), ("1, 2", "tuple"), ("round(1, 10**9)", "digits")],
)
def test_calculator_refuses_hostile_and_bad_input_quickly(expression, match):
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match=match):
        Calculator()(expression)
    assert time.perf_counter() - start < 0.5


def test_calculator_division_by_zero_is_a_zero_division_error():
    for expression in ("1/0", "1 // 0", "5 % 0", "0 ** -1", "1.0 / 0"):
        with pytest.raises(ZeroDivisionError):
            Calculator()(expression)


def test_calculator_is_exact_and_bounded_by_max_bits():
    calc = Calculator(max_bits=64)
    assert calc.evaluate("2**63") == 2**63 and isinstance(calc.evaluate("1/3"), Fraction)
    with pytest.raises(CalculatorError, match="64 bits"):
        calc.evaluate("2**64 * 2")
    with pytest.raises(ValueError, match="max_bits"):
        Calculator(max_bits=0)


@pytest.mark.parametrize(
    ("value", "text"),
    [(5, "5"), (Fraction(10, 2), "5"), (Fraction(-1, 8), "-0.125"), (Fraction(1, 3), "0.333333333333333"),
     (2.5, "2.5"), (-0.0, "0"), (Fraction(1, 2**40), "9.09494701772928e-13"), (1e20, "1e+20")],
)
def test_format_number(value, text):
    assert format_number(value) == text


# --------------------------------------------------------------------------------------- sandbox


@pytest.fixture(scope="module")
def sandbox() -> PythonSandbox:
    if not bwrap_available():
        pytest.skip("bubblewrap does not work on this machine")
    # A generous wall clock, so the CPU limit (1s) is what stops a busy loop even on a loaded machine.
    return PythonSandbox(timeout_s=10, cpu_s=1, memory_mb=256)


def test_sandbox_prints_output_and_shows_the_last_expression(sandbox):
    result = sandbox.run("for i in range(3):\n    print(i)\nx = 6\nx * 7")
    assert result.ok and result.exit_code == 0 and not result.timed_out and result.isolation == "bwrap"
    assert result.output == "0\n1\n2\n42\n" and result.content() == "0\n1\n2\n42"
    assert sandbox.run("x = 1").content() == "(no output)"
    assert sandbox("print('héllo')") == "héllo"


def test_sandbox_reports_errors_as_content(sandbox):
    result = sandbox.run("print('before')\n1/0")
    assert not result.ok and result.exit_code == 1
    assert result.content() == "before\nerror: ZeroDivisionError: division by zero"
    assert sandbox("def f(:") == "error: SyntaxError: invalid syntax (line 1)"
    assert sandbox("import sys; sys.exit(3)") == "error: [sandbox] exit status 3"


def test_sandbox_kills_a_busy_loop_at_its_cpu_limit(sandbox):
    start = time.perf_counter()
    result = sandbox.run("while True: pass")
    elapsed = time.perf_counter() - start
    assert not result.ok and "CPU" in result.error, result
    assert elapsed < 6.0  # cpu_s=1 (+1s hard limit), well below the 10s wall clock


def test_sandbox_kills_a_sleeper_at_its_wall_clock_limit(sandbox):
    start = time.perf_counter()
    result = PythonSandbox(timeout_s=1).run("import time\nprint('start', flush=True)\ntime.sleep(60)")
    elapsed = time.perf_counter() - start
    assert result.timed_out and result.error.startswith("error: [sandbox] TimeoutError")
    assert "wall-clock" in result.error
    assert result.output == "start\n"  # what was printed before the kill survives
    assert elapsed < 4.0


def test_sandbox_stops_a_memory_hog(sandbox):
    start = time.perf_counter()
    result = sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert result.error == "error: MemoryError"
    assert sandbox("bytearray(2 * 1024**3)") == "error: MemoryError"
    assert time.perf_counter() - start < 6.0


def test_sandbox_bounds_output_and_disk(sandbox):
    small = PythonSandbox(timeout_s=5, max_output=100, max_file_mb=1)
    text = small("print('x' * 10000)")
    assert text.startswith("x" * 100) and "output truncated" in text and len(text) < 200
    start = time.perf_counter()
    flood = small.run("while True:\n    print('y' * 1000)")  # the file-size limit stops it long before the clock
    assert "File too large" in flood.error and not flood.timed_out
    assert time.perf_counter() - start < 4.0
    # The working directory is a 1 MB tmpfs: many small files cannot fill the host's disk either.
    many = small("for i in range(10_000):\n    with open(f'f{i}', 'w') as f:\n        f.write('z' * 4096)")
    assert "No space left on device" in many, many


def test_sandbox_sees_only_its_own_work_directory(sandbox):
    code = "import os\nopen('out.txt', 'w').write('hi')\nos.mkdir('sub')\nprint(os.getcwd())\nsorted(os.listdir('.'))"
    assert sandbox(code) == "/work\n['out.txt', 'sub']"
    visible = set(eval(sandbox("import os; sorted(os.listdir('/'))")))  # noqa: S307 - a list literal we printed
    interpreter = {d.split("/")[1] for d in sandbox._dirs}  # an interpreter installed outside /usr, if any
    assert {"usr", "proc", "dev", "tmp", "work"} <= visible
    assert not (visible - interpreter) & {"etc", "home", "root", "run", "var", "mnt", "srv", "opt"}
    assert sandbox("import os; os.listdir('/work')") == "[]"  # a fresh directory per run


def test_sandbox_has_an_empty_environment_and_an_unprivileged_uid(sandbox, monkeypatch):
    monkeypatch.setenv("RLVR_SANDBOX_SECRET", "s3cret")
    env_text = sandbox("import os\nprint(sorted(os.environ))")
    assert "RLVR_SANDBOX_SECRET" not in env_text and env_text == "['HOME', 'LANG', 'PATH', 'PWD']"
    uid = int(sandbox("import os; os.getuid()"))
    assert uid != 0 and uid == (65534 if os.geteuid() == 0 else os.geteuid())
    assert sandbox("import sys; print(sys.stdin.read() == '')") == "True"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"timeout_s": 0}, "timeout_s"), ({"cpu_s": 0}, "cpu_s"), ({"memory_mb": 8}, "memory_mb"),
     ({"isolation": "python"}, "isolation"), ({"max_output": 1}, "max_output")],
)
def test_sandbox_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PythonSandbox(**kwargs)


def test_sandbox_refuses_oversized_code_without_running_it():
    result = PythonSandbox(max_code_chars=10, isolation="unsafe_subprocess").run("print('a long program')")
    assert result.error == "error: code longer than 10 characters" and result.exit_code is None


def test_without_bubblewrap_the_sandbox_refuses_unless_asked_by_name(monkeypatch):
    from rlvr.envs.services import sandbox as module
    from rlvr.errors import EnvError

    monkeypatch.setattr(module, "bwrap_setup", lambda: "the Python sandbox needs bubblewrap (Debian: apt-get ...)")
    with pytest.raises(EnvError, match=r"needs bubblewrap.*isolation='unsafe_subprocess'"):
        PythonSandbox()
    unsafe = PythonSandbox(isolation="unsafe_subprocess")
    assert unsafe.isolation == "unsafe_subprocess" and unsafe("1 + 1") == "2"
