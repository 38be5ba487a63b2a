// Every sol_ext op schema, and the (empty) Python module that loads them.
// Shapes, dtypes and determinism of each op are documented in sol_ext.h.
#include <Python.h>
#include <torch/library.h>

#include "cpu/cpu_capability.h"
#include "sol_ext.h"

#ifndef SOL_EXT_TORCH_VERSION
#define SOL_EXT_TORCH_VERSION "unknown"
#endif

namespace {

// A C++ error as a Python ValueError (the capability settings are values the user chose).
template <typename Body>
PyObject* as_python(Body body) {
  try {
    return body();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
    return nullptr;
  }
}

PyObject* cpu_capability(PyObject*, PyObject*) {
  return as_python([] { return PyUnicode_FromString(capability_name(sol_ext::cpu::cpu_capability())); });
}

PyObject* set_cpu_capability(PyObject*, PyObject* name) {
  return as_python([name]() -> PyObject* {
    const char* text = PyUnicode_AsUTF8(name);
    if (text == nullptr) return nullptr;
    sol_ext::cpu::set_cpu_capability(text);
    Py_RETURN_NONE;
  });
}

PyObject* cpu_capability_support(PyObject*, PyObject*) {
  PyObject* rows = PyList_New(0);
  for (const auto& row : sol_ext::cpu::capability_support()) {
    PyObject* item = Py_BuildValue("(sOO)", capability_name(row.capability), row.built ? Py_True : Py_False,
                                   row.cpu_supports ? Py_True : Py_False);
    PyList_Append(rows, item);
    Py_DECREF(item);
  }
  return rows;
}

PyMethodDef methods[] = {
    {"cpu_capability", cpu_capability, METH_NOARGS, "The capability the CPU kernels run with (cpu/cpu_capability.h)."},
    {"_set_cpu_capability", set_cpu_capability, METH_O, "Run the CPU kernels of this capability from now on."},
    {"_cpu_capability_support", cpu_capability_support, METH_NOARGS,
     "(name, built, cpu supports it) for each capability."},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

extern "C" {
// Importing sol_ext._C runs the static TORCH_LIBRARY initializers below; the module itself records which
// torch it was built against, so that a mismatch is reported instead of crashing, and says which CPU
// kernels run (cpu/cpu_capability.h).
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr) {
    PyModule_AddStringConstant(module, "torch_version", SOL_EXT_TORCH_VERSION);
  }
  return module;
}
}

TORCH_LIBRARY(sol_ext, m) {
  m.def("stochastic_dissimilarity(Tensor h, Tensor mu, float sigma) -> Tensor");
  m.def(
      "_stochastic_dissimilarity_backward(Tensor grad_D, Tensor h, Tensor mu, float sigma, "
      "bool need_grad_h, bool need_grad_mu) -> (Tensor, Tensor)");
  m.def(
      "ordering_probabilities(Tensor r_x, Tensor r_y, int num_ranks, float sigma, int tau, "
      "str convention, ScalarType dtype) -> Tensor");
  m.def(
      "order_loss(Tensor D, Tensor labels, Tensor? pairs, float sigma, int tau, float margin, "
      "str convention) -> Tensor");
  m.def(
      "_order_loss_backward(Tensor grad_losses, Tensor D, Tensor labels, Tensor? pairs, "
      "float sigma, int tau, float margin, str convention) -> Tensor");
  m.def(
      "order_loss_block(Tensor D, Tensor labels, Tensor D_all, Tensor labels_all, int offset, float sigma, "
      "int tau, float margin, str convention) -> Tensor");
  m.def(
      "_order_loss_block_backward(Tensor grad_rows, Tensor D, Tensor labels, Tensor D_all, Tensor labels_all, "
      "int offset, float sigma, int tau, float margin, str convention, bool need_grad_D, "
      "bool need_grad_D_all) -> (Tensor, Tensor)");
  m.def("disc_loss(Tensor D, Tensor labels, int T) -> Tensor");
  m.def("_disc_loss_backward(Tensor grad_losses, Tensor labels, int num_ranks, int T) -> Tensor");
  m.def(
      "stochastic_order_loss(Tensor h, Tensor mu, Tensor labels, Tensor? pairs, float sigma, int tau, "
      "float margin, int T, float disc_weight, str convention, str reduction) -> (Tensor, Tensor)");
  m.def(
      "_stochastic_order_loss_backward(Tensor grad_loss, Tensor h, Tensor mu, Tensor D, Tensor labels, "
      "Tensor? pairs, float sigma, int tau, float margin, int T, float disc_weight, str convention, "
      "str reduction, bool need_grad_h, bool need_grad_mu) -> (Tensor, Tensor)");
  m.def(
      "grouped_stochastic_order_loss(Tensor h, Tensor mu, Tensor labels, float sigma, int tau, float margin, "
      "int T, float disc_weight, str convention, str reduction, bool check_values, bool need_grad) "
      "-> (Tensor, Tensor, Tensor)");
  m.def(
      "_grouped_stochastic_order_loss_backward(Tensor grad_loss, Tensor h, Tensor mu, Tensor D, Tensor labels, "
      "Tensor grad_order, float sigma, int T, float disc_weight, str reduction, bool need_grad_h, "
      "bool need_grad_mu) -> (Tensor, Tensor)");
  m.def(
      "grouped_order_sum(Tensor D, Tensor labels, float sigma, int tau, float margin, str convention, "
      "int rank_begin, int rank_end, bool need_grad) -> (Tensor, Tensor)");
}
