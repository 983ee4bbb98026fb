"""The host layer: what every GPU entry point does on the CPU, written once.

A call of a GPU entry point goes the same way down, whichever stage it is:

    public function   forward/cuda.py, forward/tensor_cores.py, forward/hopper.py, backward/cuda.py,
                      backward/tensor_cores.py, decode/cuda.py: the contract, in its docstring
    host              check the arguments (before the GPU is looked up), find the call's plan, allocate in the
                      caller's array library, launch on its stream: this folder
    registry          forward/kernels, backward/kernels, decode/kernels: which version runs (a call names one, or
                      the registry's default rule for this GPU says)
    kernel version    what it builds and how it is sized: one file per version
    gpu/              numba's launches, or the driver's

    inputs.py    the argument checks the GPU entry points share: host or device arrays, the 16-bit types
    plans.py     the one cache of call plans, and the keys a plan depends on
    registry.py  the registry type: a kernel version, what it takes, which runs by default where
    launch.py    a version launched through numba: host arrays, the simulator, any number of heads
    sized.py     a version sized for one problem and launched through the driver: the lean path
    forward.py   the steps of a forward call on the tensor cores (stages 3 and 4)
    flex.py      the steps of a FlexAttention call (user functions compiled into v6 or v10, a block mask)
    flex_backward.py  the checks of its backward (the functions compiled into backward v2, the block mask's
                 transposed lists, the tiling that fits them)

The host layer imports ``core``, ``gpu``, ``hardware`` and ``warp_tile``'s text of head dims, never a stage: the
public functions hand it their registry.
"""
