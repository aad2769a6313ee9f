"""gpumux.cupy: CuPy's RawKernel/RawModule conventions, and the two example
programs (examples/python) as CI can run them: on the simulated device, where
they check that their inputs round-trip (the GPU check compares their
outputs with CuPy's)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gpumux
import gpumux.cupy as cp
from kernels import SCALE

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python"


def test_raw_kernel_compiles_at_first_use_and_launches(client: gpumux.Client) -> None:
    k = cp.RawKernel(SCALE, "scale")
    x = cp.asarray(np.ones(300, np.float32))
    k((2,), (256,), (x, cp.float32(3), np.int32(300)))
    k(2, 256, (x, cp.float32(3), np.int32(300)), shared_mem=0)  # ints as well as tuples
    cp.cuda.Device().synchronize()
    assert k.kernel.param_sizes == [8, 4, 4]
    assert np.array_equal(cp.asnumpy(x), np.ones(300, np.float32)), "the simulated device computes nothing"


def test_a_raw_kernel_follows_the_current_client(daemon, client: gpumux.Client) -> None:
    k = cp.RawKernel(SCALE, "nothing")
    k(1, 1, ())
    assert k.kernel.client is client
    with daemon.connect(name="second") as second:
        k(1, 1, ())
        assert k.kernel.client is second
        second.synchronize()
    assert k.kernel.client is client


def test_raw_module_get_function(client: gpumux.Client) -> None:
    m = cp.RawModule(code=SCALE, options=("-DUNUSED=1",))
    f = m.get_function("nothing")
    assert f.name == "nothing"
    f((1, 1, 1), (32, 1, 1), ())
    cp.cuda.Device().synchronize()
    with pytest.raises(KeyError, match="scale"):
        m.get_function("missing")


def test_what_is_not_covered_says_why(client: gpumux.Client) -> None:
    with pytest.raises(ValueError, match="NVRTC only"):
        cp.RawKernel(SCALE, "scale", backend="nvcc")
    with pytest.raises(NotImplementedError, match="PTX or cubin"):
        cp.RawModule(path="kernels.cubin")
    with pytest.raises(NotImplementedError, match="extern"):
        cp.RawModule(code=SCALE, name_expressions=["f<int>"])


def test_array_functions(client: gpumux.Client) -> None:
    assert np.array_equal(cp.asnumpy(cp.zeros((2, 3), cp.int32)), np.zeros((2, 3), np.int32))
    assert cp.empty(4, dtype=cp.float64).dtype == np.float64
    assert np.array_equal(cp.ones(3).get(), np.ones(3))
    assert np.array_equal(cp.full((2,), 7, np.int16).get(), np.full((2,), 7, np.int16))
    assert np.array_equal(cp.arange(5, dtype=cp.uint8).get(), np.arange(5, dtype=np.uint8))
    a = cp.asarray([[1.0, 2.0]])
    assert isinstance(a, cp.ndarray) and a.shape == (1, 2)
    assert cp.zeros_like(a).shape == (1, 2) and cp.empty_like(a, np.int8).dtype == np.int8
    assert cp.is_simulated()


def test_a_stream_as_cupy_uses_it(client: gpumux.Client) -> None:
    k = cp.RawKernel(SCALE, "nothing")
    with cp.cuda.Stream() as s:
        assert cp.cuda.get_current_stream() is s
        k(1, 1, ())
        s.synchronize()
    assert cp.cuda.get_current_stream() is client.default_stream


@pytest.mark.parametrize("program,size", [("saxpy.py", "4096"), ("matmul.py", "128")])
def test_the_example_programs_run_through_the_daemon(daemon, program: str, size: str) -> None:
    run = subprocess.run([sys.executable, str(EXAMPLES / program), "--n", size, "--reps", "2"],
                         env={**os.environ, "GPUMUX_SOCKET": daemon.socket}, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] and report["backend"] == "gpumux" and "simulated" in report["check"]


def test_the_example_programs_differ_from_cupy_programs_by_their_import_only() -> None:
    for program in ("saxpy.py", "matmul.py"):
        text = (EXAMPLES / program).read_text()
        assert "import gpumux.cupy as cp" in text and "import cupy as cp" in text
        assert "gpumux." not in text.replace("import gpumux.cupy as cp", ""), program
