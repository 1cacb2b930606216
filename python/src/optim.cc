// kiln._C fused optimizer updates: sgd_update and adam_update over lists of NDArrays (one engine
// task per call). The optimizers and the Trainer that call them live in python/kiln/optim.py and
// python/kiln/trainer.py.
#include "bind.h"
#include "call_site.h"
#include "kiln/frontend/optim.h"

namespace kiln::py {

KILN_PY_BIND(30) {
  m.def("sgd_update", [](const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& moms, double lr, double momentum, double wd,
                         double rescale_grad, double clip_gradient, std::vector<double> lr_mults,
                         std::vector<double> wd_mults) {
    optim::SGDOptions o{lr, momentum, wd, rescale_grad, clip_gradient, std::move(lr_mults),
                        std::move(wd_mults)};
    CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
    pyb::gil_scoped_release nogil;  // Push may wait for room in the engine's queue
    optim::SGDUpdate(weights, grads, moms, o);
  }, pyb::arg("weights"), pyb::arg("grads"), pyb::arg("moms"), pyb::arg("lr"), pyb::arg("momentum") = 0.0,
        pyb::arg("wd") = 0.0, pyb::arg("rescale_grad") = 1.0, pyb::arg("clip_gradient") = -1.0,
        pyb::arg("lr_mults") = std::vector<double>{}, pyb::arg("wd_mults") = std::vector<double>{},
        R"(Fused in-place SGD (MXNet's formulation) of every weight in one engine task:
g = clip(rescale_grad * grad) + wd * wd_mult * w; with momentum: mom = momentum * mom - lr * lr_mult * g,
w += mom; without (moms may be []): w -= lr * lr_mult * g. clip_gradient <= 0 disables clipping.)");

  m.def("adam_update", [](const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& means, const std::vector<Tensor>& vars, double lr,
                          double beta1, double beta2, double epsilon, double wd, double rescale_grad,
                          double clip_gradient, int64_t t, bool decoupled, std::vector<double> lr_mults,
                          std::vector<double> wd_mults) {
    optim::AdamOptions o{lr, beta1, beta2, epsilon, wd, rescale_grad, clip_gradient, t, decoupled,
                         std::move(lr_mults), std::move(wd_mults)};
    CallSiteScope site;  // before the GIL goes: errors of the queued tasks name it
    pyb::gil_scoped_release nogil;
    optim::AdamUpdate(weights, grads, means, vars, o);
  }, pyb::arg("weights"), pyb::arg("grads"), pyb::arg("means"), pyb::arg("vars"), pyb::arg("lr"),
        pyb::arg("beta1") = 0.9, pyb::arg("beta2") = 0.999, pyb::arg("epsilon") = 1e-8, pyb::arg("wd") = 0.0,
        pyb::arg("rescale_grad") = 1.0, pyb::arg("clip_gradient") = -1.0, pyb::arg("t") = 1,
        pyb::arg("decoupled") = false, pyb::arg("lr_mults") = std::vector<double>{},
        pyb::arg("wd_mults") = std::vector<double>{},
        R"(Fused in-place Adam (decoupled=False) or AdamW (decoupled=True) of every weight in one engine
task, bias-corrected for step t (from 1) as torch.optim.Adam/AdamW.)");
}

}  // namespace kiln::py
