"""The native binder: a CPU module's run, from the caller's list of arrays to the list it gets
back, in one C call.

    path = library(target)                   # built once (None: no compiler or headers)
    binder = Binder.make(buffers, graph, path)   # None where the graph's outputs do not suit
    outputs = binder.run(inputs)             # None where the inputs need the checked path

`Module.run` on the native command runner (native.py) costs the commands plus the Python
around them: checking the inputs, taking each output's array from its pool, writing the
pointers the runner reads, making the list it returns. After a run's kernels have swept the
caches (gpt2-decode's 28 MB of weights through a 32 MB L3), every Python object and every
line of the interpreter that this touches is a miss: 80-90 us a step, against 0.45 ms of
kernels. The binder does the same in C, through the CPython and numpy C APIs: it reads each
input's type, shape, byte order and contiguity, takes a free array from each output's pool
(one that only the pool references: refcount 1) or a new one, patches the runner's bound
pointers, calls the runner with the GIL released, and returns the outputs.

It handles the usual call only: a list or tuple of exact ndarrays of the graph's types and
shapes, C-contiguous, in native byte order, for a graph each of whose outputs is a distinct
value a command computes (no output that is an input, a constant, a reshaped view or another
output). Anything else returns None and takes `Module`'s Python path, which converts what it
can and says what is wrong. The extension is built once per interpreter and machine through
the build cache (it needs the C compiler and Python's headers; without them modules run on
the Python path as before); an artifact carries its image, used where the interpreter's ABI
and numpy's version are the ones it was built with (`abi`), so loading compiles nothing. The
`native_bind` knob (HEXIR_NATIVE_BIND=0) turns it off.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import BuildError
from hexir.ir.dtype import numpy_dtype
from hexir.runtime.target import Target

if TYPE_CHECKING:
    from hexir.ir.graph import Graph
    from hexir.runtime.module import _CpuBuffers

__all__ = ["BINDER_SOURCE", "Binder"]

_NAME = "hexir_binder"
POOL = 3  # arrays kept per output (the Python path's OUTPUT_POOL too)

BINDER_SOURCE = r"""
/* Hexir's native binder (hexir/runtime/binder.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>

#define POOL @POOL@

typedef void (*entry_t)(int64_t, void *const *, const int64_t *, void **, int64_t,
                        const int64_t *, const int64_t *, void *const *, double *);

typedef struct {
  int ndim, type;
  npy_intp dims[NPY_MAXDIMS];
  Py_ssize_t slot;            /* in the runner's bound pointers */
  PyObject *pool[POOL];       /* outputs: the arrays kept, NULL where none yet */
} spec_t;

typedef struct {
  Py_ssize_t n_in, n_out;
  spec_t *in, *out;
  void **bound;
  double *seconds;            /* the runner's per-command seconds, for a timed run */
  entry_t entry;
  int64_t args[7];            /* the runner's first seven arguments */
} binder_t;

static void destroy(PyObject *capsule) {
  binder_t *b = PyCapsule_GetPointer(capsule, "hexir.binder");
  if (b == NULL) return;
  for (Py_ssize_t j = 0; j < b->n_out; ++j)
    for (int k = 0; k < POOL; ++k) Py_XDECREF(b->out[j].pool[k]);
  PyMem_Free(b->in);
  PyMem_Free(b->out);
  PyMem_Free(b);
}

/* One spec from (slot, type number, shape tuple). */
static int read_spec(PyObject *item, spec_t *s) {
  PyObject *shape;
  if (!PyArg_ParseTuple(item, "niO!", &s->slot, &s->type, &PyTuple_Type, &shape)) return -1;
  s->ndim = (int)PyTuple_GET_SIZE(shape);
  if (s->ndim > NPY_MAXDIMS) {
    PyErr_SetString(PyExc_ValueError, "too many dimensions");
    return -1;
  }
  for (int d = 0; d < s->ndim; ++d) {
    s->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
    if (s->dims[d] < 0 && PyErr_Occurred()) return -1;
  }
  for (int k = 0; k < POOL; ++k) s->pool[k] = NULL;
  return 0;
}

static int read_specs(PyObject *list, spec_t **out, Py_ssize_t *n) {
  *n = PyList_GET_SIZE(list);
  *out = PyMem_Calloc(*n > 0 ? *n : 1, sizeof(spec_t));
  if (*out == NULL) return -1;
  for (Py_ssize_t i = 0; i < *n; ++i)
    if (read_spec(PyList_GET_ITEM(list, i), &(*out)[i]) < 0) return -1;
  return 0;
}

/* make(inputs, outputs, bound, seconds, entry, args): specs as lists of (slot, type, shape);
   `bound` the address of the runner's pointer array, `seconds` of its per-command seconds,
   `entry` of its function, `args` its arguments from the first to the seventh. */
static PyObject *make(PyObject *self, PyObject *a) {
  PyObject *ins, *outs, *args;
  unsigned long long bound, seconds, entry;
  if (!PyArg_ParseTuple(a, "O!O!KKKO!", &PyList_Type, &ins, &PyList_Type, &outs, &bound,
                        &seconds, &entry, &PyTuple_Type, &args))
    return NULL;
  if (PyTuple_GET_SIZE(args) != 7) {
    PyErr_SetString(PyExc_ValueError, "the runner takes 7 arguments before bound");
    return NULL;
  }
  binder_t *b = PyMem_Calloc(1, sizeof(binder_t));
  if (b == NULL) return PyErr_NoMemory();
  PyObject *capsule = PyCapsule_New(b, "hexir.binder", destroy);
  if (capsule == NULL) {
    PyMem_Free(b);
    return NULL;
  }
  if (read_specs(ins, &b->in, &b->n_in) < 0 || read_specs(outs, &b->out, &b->n_out) < 0) {
    Py_DECREF(capsule);
    return NULL;
  }
  b->bound = (void **)(uintptr_t)bound;
  b->seconds = (double *)(uintptr_t)seconds;
  b->entry = (entry_t)(uintptr_t)entry;
  for (int i = 0; i < 7; ++i) {
    b->args[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args, i));
    if (PyErr_Occurred()) {
      Py_DECREF(capsule);
      return NULL;
    }
  }
  return capsule;
}

static int matches(PyObject *o, const spec_t *s) {
  if (!PyArray_CheckExact(o)) return 0;
  PyArrayObject *a = (PyArrayObject *)o;
  if (PyArray_NDIM(a) != s->ndim || PyArray_TYPE(a) != s->type) return 0;
  if (!PyArray_ISNOTSWAPPED(a) || !PyArray_IS_C_CONTIGUOUS(a)) return 0;
  const npy_intp *dims = PyArray_DIMS(a);
  for (int d = 0; d < s->ndim; ++d)
    if (dims[d] != s->dims[d]) return 0;
  return 1;
}

/* An array for output `s` that only its pool references, else a new one (kept while the
   pool has room); a new reference. */
static PyObject *fresh(spec_t *s) {
  for (int k = 0; k < POOL; ++k)
    if (s->pool[k] != NULL && Py_REFCNT(s->pool[k]) == 1) {
      Py_INCREF(s->pool[k]);
      return s->pool[k];
    }
  PyObject *array = PyArray_EMPTY(s->ndim, s->dims, s->type, 0);
  if (array == NULL) return NULL;
  for (int k = 0; k < POOL; ++k)
    if (s->pool[k] == NULL) {
      Py_INCREF(array);
      s->pool[k] = array;
      break;
    }
  return array;
}

/* run(binder, inputs[, timed]): the outputs, or None where the inputs need the checked
   path; timed, the runner writes each command's seconds. */
static PyObject *run(PyObject *self, PyObject *const *a, Py_ssize_t n) {
  if (n != 2 && n != 3) {
    PyErr_SetString(PyExc_TypeError, "run(binder, inputs[, timed])");
    return NULL;
  }
  binder_t *b = PyCapsule_GetPointer(a[0], "hexir.binder");
  if (b == NULL) return NULL;
  double *seconds = n == 3 && PyObject_IsTrue(a[2]) ? b->seconds : NULL;
  PyObject *inputs = a[1];
  if (!PyList_CheckExact(inputs) && !PyTuple_CheckExact(inputs)) Py_RETURN_NONE;
  if (PySequence_Fast_GET_SIZE(inputs) != b->n_in) Py_RETURN_NONE;
  PyObject **items = PySequence_Fast_ITEMS(inputs);
  for (Py_ssize_t i = 0; i < b->n_in; ++i)
    if (!matches(items[i], &b->in[i])) Py_RETURN_NONE;
  for (Py_ssize_t i = 0; i < b->n_in; ++i)
    b->bound[b->in[i].slot] = PyArray_DATA((PyArrayObject *)items[i]);
  PyObject *result = PyList_New(b->n_out);
  if (result == NULL) return NULL;
  for (Py_ssize_t j = 0; j < b->n_out; ++j) {
    PyObject *array = fresh(&b->out[j]);
    if (array == NULL) {
      Py_DECREF(result);
      return NULL;
    }
    b->bound[b->out[j].slot] = PyArray_DATA((PyArrayObject *)array);
    PyList_SET_ITEM(result, j, array);
  }
  Py_BEGIN_ALLOW_THREADS
  b->entry(b->args[0], (void *const *)(uintptr_t)b->args[1], (const int64_t *)(uintptr_t)b->args[2],
           (void **)(uintptr_t)b->args[3], b->args[4], (const int64_t *)(uintptr_t)b->args[5],
           (const int64_t *)(uintptr_t)b->args[6], b->bound, seconds);
  Py_END_ALLOW_THREADS
  return result;
}

static PyMethodDef methods[] = {
  {"make", make, METH_VARARGS, "make(inputs, outputs, bound, seconds, entry, args) -> binder"},
  {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
   "run(binder, inputs[, timed]) -> outputs"},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "hexir_binder", NULL, -1, methods};

PyMODINIT_FUNC PyInit_hexir_binder(void) {
  import_array();
  return PyModule_Create(&definition);
}
""".replace("@POOL@", str(POOL))


def abi() -> str:
    """What the binder's image was built against: this interpreter's ABI and numpy's version.
    An artifact's image is used only where both are the same."""
    return f"{sysconfig.get_config_var('SOABI')} numpy {np.__version__}"


@functools.cache
def library(target: Target) -> Path | None:
    """The binder's extension, built once per interpreter and machine through the build cache;
    None where it cannot be (no compiler, or no Python headers)."""
    from hexir.runtime.cc import compile_c

    include = [sysconfig.get_paths()["include"], np.get_include()]
    try:
        return compile_c(BINDER_SOURCE, target, include_dirs=include)
    except BuildError:
        return None


@functools.cache
def _extension(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(_NAME, str(path))
    spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
    assert spec is not None
    extension = importlib.util.module_from_spec(spec)
    loader.exec_module(extension)
    return extension


class Binder:
    """A module's binder: its C state and the extension's `run`."""

    def __init__(self, state: object, run: object):
        self._state = state
        self._run = run

    def run(self, inputs: Sequence[np.ndarray], timed: bool = False) -> list[np.ndarray] | None:
        """The outputs, None where the inputs need the checked path; `timed`, the runner's
        per-command seconds are written (NativeRunner.seconds)."""
        return self._run(self._state, inputs, timed)  # type: ignore[operator]

    @staticmethod
    def make(buffers: _CpuBuffers, graph: Graph, path: Path) -> Binder | None:
        """The binder of a module's buffers (with their native runner) from the extension at
        `path`, None where the graph's outputs are not each a distinct computed value."""
        runner = buffers.runner
        assert runner is not None
        outputs = [v.name for v in graph.outputs]
        if sorted(outputs) != sorted(buffers.returned):
            return None
        if len(set(outputs)) < len(outputs) or any(buffers._root(n) != n for n in outputs):
            return None
        extension = _extension(path)
        slot = {name: i for i, name in enumerate(buffers.bound_names)}  # inputs and outputs

        def spec(name: str) -> tuple[int, int, tuple[int, ...]]:
            t = buffers.types[name]
            return slot[name], np.dtype(numpy_dtype(t.dtype)).num, tuple(t.shape)

        call = runner.call_addresses()
        state = extension.make(
            [spec(v.name) for v in graph.inputs],
            [spec(name) for name in outputs],
            call["bound"],
            call["seconds"],
            call["entry"],
            call["args"],
        )
        return Binder(state, extension.run)
