// A consumer that links only attnstate::cuda: a link test of the CUDA decode and cascade entry
// points (the calls run only with an argument, so no GPU is needed to run it).
#include <cstdio>

#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/cuda/merge.hpp"

using namespace attnstate;

int main(int argc, char**) {
  if (argc > 1) {  // never in the test: these only have to link
    const cuda::DecodePlan decode = cuda::plan_decode(DecodeProblem{}, nullptr, DecodeOptions{}, 1);
    cuda::run_decode(decode, ConstTensorView{}, PagedKvCache{}, StateView{}, nullptr, 0);
    const cuda::CascadePlan cascade =
        cuda::plan_cascade(cuda::CascadeShape{}, nullptr, 0, CascadeOptions{}, 1);
    cuda::run_cascade(cascade, ConstTensorView{}, PagedKvCache{}, nullptr, 0, StateView{}, nullptr,
                      0);
    cuda::merge_state(ConstStateView{}, ConstStateView{}, StateView{});
  }
  std::printf("consumer_cuda: linked\n");
  return 0;
}
