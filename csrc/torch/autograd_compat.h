// The one place where our autograd nodes depend on the torch version.  From
// torch 2.13 a torch::autograd::Node is owned by c10::intrusive_ptr; before,
// by std::shared_ptr with torch's deleteNode as deleter (it frees a long
// chain of nodes without deep recursion).  Code that needs the node's owning
// pointer from inside it calls node->getptr(), which both versions have.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#include <memory>

namespace fln::glue {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
template <typename N>
c10::intrusive_ptr<N> make_node() {
  return c10::make_intrusive<N>();
}
#else
template <typename N>
std::shared_ptr<N> make_node() {
  return std::shared_ptr<N>(new N(), torch::autograd::deleteNode);
}
#endif

}  // namespace fln::glue
