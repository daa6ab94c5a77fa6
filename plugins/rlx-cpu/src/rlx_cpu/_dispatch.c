/* rlx_cpu._dispatch: a compiled dispatch loop for runs of bound oneDNN primitives.
 *
 * Why: a dense program's merged team run (rlx_cpu.onednn_conv.sequence) is a handful of C calls
 * (the OpenMP thread count read, set and restored, one dnnl_primitive_execute per primitive). From
 * Python each is a ctypes call through libffi, and at batch 1 they run with caches the weights just
 * went through, at several times their warm cost. Here the whole run is one call of a plan made
 * once: the function addresses and the bound primitives, as 64-bit words.
 *
 * The module knows nothing of oneDNN's headers: the plan carries the addresses ctypes resolved, and
 * it keeps a reference to the Python objects that own every pointer in it (the primitives, their
 * argument arrays), so the memory outlives the plan. Optional: without a C compiler at install the
 * Python loop runs the same primitives (rlx_cpu.onednn_conv._grouped).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*execute_fn)(void *primitive, void *stream, int nargs, const void *args);
typedef int (*get_threads_fn)(void);
typedef void (*set_threads_fn)(int);

typedef struct {
    int64_t threads;
    void *primitive;
    int64_t nargs;
    const void *args;
} step_t;

typedef struct {
    PyObject_HEAD
    execute_fn execute;
    get_threads_fn get_threads;
    set_threads_fn set_threads;
    char *into;   /* the program's input buffer (run_io copies its argument here first), or NULL */
    int64_t into_nbytes;
    const char *from; /* the program's output buffer (run_io copies it out last), or NULL */
    int64_t from_nbytes;
    int64_t nan_scan; /* run_io: 0, or 4 / 8 to report a NaN among out's float32 / float64 values */
    Py_ssize_t n;
    step_t *steps;
    PyObject *keep; /* owns what the pointers point into */
} Plan;

static void plan_dealloc(Plan *self) {
    PyMem_Free(self->steps);
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plan(words, keep): words = [execute, get_threads, set_threads, into, into_nbytes, from,
 * from_nbytes, nan_scan, (threads, primitive, nargs, args) * n] as a C-contiguous buffer of int64
 * (into and from: 0 for a plan that run_io may not be given). */
#define HEADER 8
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *words_obj, *keep;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Plan() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO:Plan", &words_obj, &keep)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(words_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    /* 64-bit integers only: a float64 buffer has the same item size */
    const char *fmt = view.format != NULL ? view.format : "B";
    char code = fmt[0] != '\0' ? fmt[strlen(fmt) - 1] : 'B';
    if (view.itemsize != 8 || strchr("lqLQ", code) == NULL || view.len < HEADER * 8
        || (view.len / 8 - HEADER) % 4 != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "Plan words: 8 + 4 * n int64 values");
        return NULL;
    }
    const int64_t *w = (const int64_t *)view.buf;
    Py_ssize_t n = (Py_ssize_t)((view.len / 8 - HEADER) / 4);
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    self->steps = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(step_t));
    if (self->steps == NULL) {
        PyBuffer_Release(&view);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->execute = (execute_fn)(intptr_t)w[0];
    self->get_threads = (get_threads_fn)(intptr_t)w[1];
    self->set_threads = (set_threads_fn)(intptr_t)w[2];
    self->into = (char *)(intptr_t)w[3];
    self->into_nbytes = w[4];
    self->from = (const char *)(intptr_t)w[5];
    self->from_nbytes = w[6];
    self->nan_scan = w[7];
    if (self->nan_scan != 0 && self->nan_scan != 4 && self->nan_scan != 8) {
        PyBuffer_Release(&view);
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "Plan: nan_scan is 0, 4 or 8");
        return NULL;
    }
    if (self->into_nbytes < 0 || self->from_nbytes < 0) {
        PyBuffer_Release(&view);
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "Plan: a negative byte count");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *s = w + HEADER + 4 * i;
        if (s[0] < 1 || s[2] < 0 || s[2] > INT32_MAX) {
            PyBuffer_Release(&view);
            Py_DECREF(self);
            PyErr_SetString(PyExc_ValueError, "Plan step: threads >= 1, 0 <= nargs < 2**31");
            return NULL;
        }
        self->steps[i].threads = s[0];
        self->steps[i].primitive = (void *)(intptr_t)s[1];
        self->steps[i].nargs = s[2];
        self->steps[i].args = (const void *)(intptr_t)s[3];
    }
    self->n = n;
    PyBuffer_Release(&view);
    if (self->execute == NULL || self->get_threads == NULL || self->set_threads == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "Plan: a function address is 0");
        return NULL;
    }
    Py_INCREF(keep);
    self->keep = keep;
    return (PyObject *)self;
}

static int steps(const Plan *self, void *stream) {
    int status = 0;
    int prev = self->get_threads();
    int cur = prev;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        const step_t *s = &self->steps[i];
        if (s->threads != cur) {
            cur = (int)s->threads;
            self->set_threads(cur);
        }
        status = self->execute(s->primitive, stream, (int)s->nargs, s->args);
        if (status != 0) break;
    }
    if (cur != prev) self->set_threads(prev);
    return status;
}

/* run(plan, stream) -> 0, or the status of the first primitive that failed (the rest do not run).
 * The GIL is released meanwhile, as ctypes would; the caller's OpenMP thread count is restored.
 * A module function with the fast calling convention: no argument tuple per call. */
static PyTypeObject PlanType;

static void *stream_of(PyObject *obj) {
    void *stream = PyLong_AsVoidPtr(obj);
    if (stream == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a run needs a oneDNN stream, not 0");
    return stream;
}

static PyObject *run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !Py_IS_TYPE(args[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "run(plan: Plan, stream: int)");
        return NULL;
    }
    Plan *self = (Plan *)args[0];
    void *stream = stream_of(args[1]);
    if (stream == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = steps(self, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* Any NaN among the n bytes at p, read as float32 (size 4) or float64 (size 8)? */
static int has_nan(const char *p, int64_t n, int64_t size) {
    int bad = 0;
    if (size == 4) {
        const float *f = (const float *)p;
        for (int64_t i = 0; i < n / 4; i++) bad |= f[i] != f[i];
    } else {
        const double *f = (const double *)p;
        for (int64_t i = 0; i < n / 8; i++) bad |= f[i] != f[i];
    }
    return bad;
}

/* run_io(plan, stream, src, out) -> status: src's bytes into the plan's input buffer, the steps,
 * then the plan's output buffer into out (both C-contiguous, of exactly the buffers' sizes). Out
 * is written only when every primitive succeeded. One call for what a program's run does around
 * its kernels: the input's copy and the output's. With nan_scan, -1 when out holds a NaN (the
 * caller's NaN-row pass then runs; a softmax head's output has none otherwise). */
static PyObject *run_io(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !Py_IS_TYPE(args[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "run_io(plan: Plan, stream: int, src, out)");
        return NULL;
    }
    Plan *self = (Plan *)args[0];
    if (self->into == NULL || self->from == NULL) {
        PyErr_SetString(PyExc_ValueError, "run_io: this plan has no input and output buffers");
        return NULL;
    }
    void *stream = stream_of(args[1]);
    if (stream == NULL) return NULL;
    Py_buffer src, out;
    if (PyObject_GetBuffer(args[2], &src, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[3], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (src.len != self->into_nbytes || out.len != self->from_nbytes) {
        PyErr_Format(PyExc_ValueError, "run_io: %zd and %zd bytes given, the plan's buffers hold %lld and %lld",
                     src.len, out.len, (long long)self->into_nbytes, (long long)self->from_nbytes);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    memmove(self->into, src.buf, (size_t)src.len);
    status = steps(self, stream);
    if (status == 0) {
        memmove(out.buf, self->from, (size_t)out.len);
        if (self->nan_scan && has_nan(out.buf, out.len, self->nan_scan)) status = -1;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return PyLong_FromLong(status);
}

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlx_cpu._dispatch.Plan",
    .tp_doc = PyDoc_STR("Plan(words, keep): bound oneDNN primitives, run by run(plan, stream)."),
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = plan_new,
    .tp_dealloc = (destructor)plan_dealloc,
};

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(plan, stream) -> 0 or the first failing oneDNN status."},
    {"run_io", (PyCFunction)(void (*)(void))run_io, METH_FASTCALL,
     "run_io(plan, stream, src, out) -> status: src in, the steps, the output into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dispatch", "A compiled dispatch loop for bound oneDNN primitives.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__dispatch(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
