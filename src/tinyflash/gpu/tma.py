"""Hopper's tensor memory accelerator (TMA), its transaction barriers (mbarrier) and the instructions of warp
specialisation (setmaxnreg, named barriers), one function per instruction, for numba.cuda kernels.

As ``ptx.py`` and ``wgmma.py`` do, each function emits PTX through LLVM inline assembly; on numba's simulator
``tma_emulation.py`` runs it instead (chosen once, in ``_impl``). Compute capability 9.0; ``setmaxnreg`` needs
the ``sm_90a`` target. PTX ISA sections: "Parallel Synchronization and Communication Instructions: mbarrier",
"Data Movement and Conversion Instructions: cp.async.bulk.tensor, cp.reduce.async.bulk.tensor,
cp.async.bulk.commit_group, cp.async.bulk.wait_group", "Miscellaneous Instructions: setmaxnreg",
"bar, barrier".

**TMA.** One thread asks the copy engine for a whole box of a tensor: ``tma_load_3d`` copies a box of 64 16-bit
columns × R rows of one head from global memory into shared memory, 128-byte swizzled (the layout the wgmma
descriptors read, ``wgmma.swizzled_chunk``), rows outside the tensor filled with zeros. The tensor's shape,
strides, box and swizzle are in a 128-byte *tensor map* that the host encodes (``tensor_map.py``); the kernel
gets the maps in a global array and names one by its index. No thread computes an address or moves a byte.

**mbarrier.** A 64-bit object in shared memory that counts two things for its current *phase*: arrivals of
threads (it is initialised with how many to expect) and bytes of asynchronous copies (a thread announces them
with ``arrive_expect_tx``; each TMA copy that lands subtracts its bytes, ``complete_tx``). When both reach zero
the phase completes: its parity bit flips and the counts start over. A thread waits for the completion of the
phase of parity P with ``try_wait(bar, P)`` in a loop (:func:`wait`). A ring of S stages uses stage s's
barrier for tiles s, s + S, s + 2S, ...: tile j waits for parity (j // S) % 2.

**Warp specialisation.** ``setmaxnreg`` hands registers from one warpgroup to another: a producer that only
issues TMA copies gives up registers (``dec``), the consumers that multiply take them (``inc``); ptxas keeps
it only in a kernel compiled with launch bounds or a register cap. ``bar.sync id, n`` / ``bar.arrive id, n``
are barriers of n threads (a multiple of 32) named 1 .. 15 (0 is ``__syncthreads``'s): two consumer
warpgroups take turns through them without stopping the producer.
"""

from __future__ import annotations

from types import SimpleNamespace

from numba import cuda, uint32

from .runtime import simulator_enabled

MAP_WORDS = 16  # a CUtensorMap is 128 bytes, 64-byte aligned: 16 uint64 words of the maps' array
BARRIER_BYTES = 8  # an mbarrier
REGISTER_COUNTS = range(24, 257, 8)  # what setmaxnreg may ask for


def _intrinsics():
    """The real instructions, compiled into the kernel (imported only off the simulator)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from .inline_asm import asm, void_instruction

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def map_address(context, builder, aryty, array, index):
        """The generic address of tensor map ``index`` in the maps' array (16 words each)."""
        data = context.make_array(aryty)(context, builder, value=array).data
        word = builder.mul(index, ir.Constant(i64, MAP_WORDS))
        return builder.ptrtoint(builder.gep(data, [word]), i64)

    def statement(text, two_operands):
        """An instruction on a uint32 (an mbarrier's address, a named barrier's id) and, with ``two_operands``, a
        uint32; no result."""
        def codegen(context, builder, sig, args):
            asm(builder, text, ",".join(["r"] * len(args) + ["~{memory}"]), ir.VoidType(), list(args))
            return context.get_dummy_value()

        if two_operands:
            @intrinsic
            def instruction(typingctx, bar, value):
                return types.void(types.uint32, types.uint32), codegen
        else:
            @intrinsic
            def instruction(typingctx, bar):
                return types.void(types.uint32), codegen

        return instruction

    @intrinsic
    def try_wait(typingctx, bar, parity):
        sig = types.uint32(types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            return asm(builder, "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                       "selp.u32 $0, 1, 0, p; }", "=r,r,r,~{memory}", i32, list(args))

        return sig, codegen

    @intrinsic
    def tma_load_3d(typingctx, dst, maps, index, col, row, head, bar):
        sig = types.void(types.uint32, maps, types.uint64, types.int32, types.int32, types.int32, types.uint32)

        def codegen(context, builder, sig, args):
            tmap = map_address(context, builder, sig.args[1], args[1], args[2])
            asm(builder, "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                "[$0], [$1, {$2, $3, $4}], [$5];", "r,l,r,r,r,r,~{memory}", ir.VoidType(),
                [args[0], tmap, args[3], args[4], args[5], args[6]])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def tma_reduce_add_3d(typingctx, src, maps, index, col, row, head):
        sig = types.void(types.uint32, maps, types.uint64, types.int32, types.int32, types.int32)

        def codegen(context, builder, sig, args):
            tmap = map_address(context, builder, sig.args[1], args[1], args[2])
            asm(builder, "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [$0, {$2, $3, $4}], [$1];",
                "l,r,r,r,r,~{memory}", ir.VoidType(), [tmap, args[0], args[3], args[4], args[5]])
            return context.get_dummy_value()

        return sig, codegen

    def map_instruction(text):
        @intrinsic
        def instruction(typingctx, maps, index):
            sig = types.void(maps, types.uint64)

            def codegen(context, builder, sig, args):
                asm(builder, text, "l,~{memory}", ir.VoidType(), [map_address(context, builder, sig.args[0], *args)])
                return context.get_dummy_value()

            return sig, codegen

        return instruction

    return SimpleNamespace(
        mbarrier_init=statement("mbarrier.init.shared::cta.b64 [$0], $1;", True),
        arrive=statement("mbarrier.arrive.shared::cta.b64 _, [$0];", False),
        arrive_expect_tx=statement("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", True),
        try_wait=try_wait, tma_load_3d=tma_load_3d, tma_reduce_add_3d=tma_reduce_add_3d,
        bulk_commit_group=void_instruction("cp.async.bulk.commit_group;"),
        bulk_wait_read=void_instruction("cp.async.bulk.wait_group.read 0;"),
        bulk_wait=void_instruction("cp.async.bulk.wait_group 0;"),
        acquire_map=map_instruction("fence.proxy.tensormap::generic.acquire.gpu [$0], 128;"),
        prefetch_map=map_instruction("prefetch.tensormap [$0];"),
        make_setmaxnreg=lambda grow, n: void_instruction(
            f"setmaxnreg.{'inc' if grow else 'dec'}.sync.aligned.u32 {n};"),
        make_named_barrier=lambda arrive_only, ident, n: void_instruction(
            f"bar.{'arrive' if arrive_only else 'sync'} {ident}, {n};"),
        make_named_barrier_by_id=lambda arrive_only, n: statement(
            f"bar.{'arrive' if arrive_only else 'sync'} $0, {n};", False))


def _implementation():
    if simulator_enabled():
        from . import tma_emulation

        return tma_emulation
    return _intrinsics()


_impl = _implementation()  # the one place where the real instruction or its emulation is chosen

mbarrier_init = _impl.mbarrier_init
"""mbarrier_init(bar, count): initialise the mbarrier at shared byte address ``bar`` (uint32, 8-byte aligned) to
expect ``count`` (uint32) arrivals per phase; its phase 0 is in progress. One thread; then
``wgmma.fence_proxy_async`` (the copies complete it through the async proxy) and a barrier of the block before
anyone uses it. PTX: ``mbarrier.init.shared::cta.b64 [bar], count;``
"""

arrive = _impl.arrive
"""arrive(bar): this thread arrives on the mbarrier's current phase. PTX: ``mbarrier.arrive.shared::cta.b64 _, [bar];``
"""

arrive_expect_tx = _impl.arrive_expect_tx
"""arrive_expect_tx(bar, nbytes): announce ``nbytes`` (uint32) of copies that will complete on this phase, and
arrive. Called by the thread that issues the copies, before or after them (the count may go below zero for a
while). PTX: ``mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], nbytes;``
"""

try_wait = _impl.try_wait
"""try_wait(bar, parity) -> uint32: 1 once the phase of parity ``parity`` (0 or 1) has completed, else 0 after a
time the hardware chooses (the thread may be suspended meanwhile). A phase's parity is its number mod 2; on a
fresh barrier, parity 1 counts as completed (the phase before phase 0). PTX:
``mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;``
"""

tma_load_3d = _impl.tma_load_3d
"""tma_load_3d(dst, maps, index, col, row, head, bar): copy the box of tensor map ``maps[index]`` (uint64 index)
whose first element is (column ``col``, row ``row``, head ``head``), int32 coordinates, into shared memory at
``dst`` (uint32, 1024-byte aligned for the 128-byte swizzle), and complete its bytes on the mbarrier ``bar``.
Elements outside the tensor are zeros and count as bytes. One thread. PTX:
``cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst], [map, {col, row, head}],
[bar];``
"""

tma_reduce_add_3d = _impl.tma_reduce_add_3d
"""tma_reduce_add_3d(src, maps, index, col, row, head): add the box at shared byte ``src`` (uint32, 1024-byte
aligned, 128-byte swizzled) to the box of tensor map ``maps[index]`` (a float32 map, ``TensorMap(...,
element_bytes=4)``) whose first element is (column ``col``, row ``row``, head ``head``), element by element, in
global memory (each add atomic); elements outside the tensor are left out. Asynchronous, in this thread's
current bulk group (:data:`bulk_commit_group`); the shared box must not be written again before
:data:`bulk_wait_read`. The writes of other threads to the box reach the copy engine through
``wgmma.fence_proxy_async`` and a barrier. One thread. PTX:
``cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [map, {col, row, head}], [src];``
"""

bulk_commit_group = _impl.bulk_commit_group
"""bulk_commit_group(): close this thread's bulk group of asynchronous reduce-adds (or stores) issued since the
last. PTX: ``cp.async.bulk.commit_group;``
"""

bulk_wait_read = _impl.bulk_wait_read
"""bulk_wait_read(): wait until every bulk group of this thread has read its shared memory (the sources may be
written again; the global writes may still be in flight). PTX: ``cp.async.bulk.wait_group.read 0;``
"""

bulk_wait = _impl.bulk_wait
"""bulk_wait(): wait until every bulk group of this thread is complete, its global writes done. PTX:
``cp.async.bulk.wait_group 0;``
"""

acquire_map = _impl.acquire_map
"""acquire_map(maps, index): make the tensor map that the host copied into global memory visible to the copy
engine (the tensor-map proxy) for this thread's copies that follow. PTX:
``fence.proxy.tensormap::generic.acquire.gpu [map], 128;``
"""

prefetch_map = _impl.prefetch_map
"""prefetch_map(maps, index): bring the tensor map into the cache of tensor maps ahead of the first copy.
PTX: ``prefetch.tensormap [map];``
"""


@cuda.jit(device=True, inline="always")
def wait(bar, parity):
    """Wait until the phase of parity ``parity`` of the mbarrier ``bar`` has completed (:data:`try_wait` in a loop)."""
    while try_wait(bar, parity) == uint32(0):
        pass


def setmaxnreg(grow: bool, count: int):
    """A device function ``setmaxnreg()``: this warpgroup's registers per thread become ``count`` (24 .. 256, a
    multiple of 8): more (``grow``, the consumers) or fewer (the producer). Every thread of the warpgroup calls
    it. PTX: ``setmaxnreg.{inc,dec}.sync.aligned.u32 count;`` (sm_90a)."""
    if count not in REGISTER_COUNTS:
        raise ValueError(f"setmaxnreg takes a multiple of 8 from 24 to 256; got {count}")
    return _impl.make_setmaxnreg(grow, count)


def named_barrier(ident: int, threads: int, arrive_only: bool = False):
    """A device function ``barrier()``: barrier ``ident`` (1 .. 15) of ``threads`` threads (a multiple of 32).
    ``bar.sync`` waits until ``threads`` have arrived; ``bar.arrive`` (``arrive_only``) counts this warp and goes
    on. PTX: ``bar.sync ident, threads;`` / ``bar.arrive ident, threads;``"""
    if not 1 <= ident <= 15 or threads % 32 or threads <= 0:
        raise ValueError(f"a named barrier has an id 1 .. 15 and a multiple of 32 threads; got {ident}, {threads}")
    return _impl.make_named_barrier(arrive_only, ident, threads)


def named_barrier_by_id(threads: int, arrive_only: bool = False):
    """As :func:`named_barrier`, the id given at run time: a device function ``barrier(ident)``, ``ident`` a uint32
    from 1 to 15, the same for every lane of a warp (each warpgroup of a kernel its own barrier, say).
    PTX: ``bar.sync ident, threads;`` / ``bar.arrive ident, threads;`` with ``ident`` in a register."""
    if threads % 32 or threads <= 0:
        raise ValueError(f"a named barrier has a multiple of 32 threads; got {threads}")
    return _impl.make_named_barrier_by_id(arrive_only, threads)


__all__ = ["BARRIER_BYTES", "MAP_WORDS", "acquire_map", "arrive", "arrive_expect_tx", "bulk_commit_group", "bulk_wait",
           "bulk_wait_read", "mbarrier_init", "named_barrier", "named_barrier_by_id", "prefetch_map", "setmaxnreg",
           "tma_load_3d", "tma_reduce_add_3d", "try_wait", "wait"]
