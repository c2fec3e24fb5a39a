"""Real execution of a Plan with torch.distributed: PS shards and workers.

``hetsim run PLAN_OR_CONFIG`` (:mod:`experiments.run`) builds a
:class:`runtime.spec.RunSpec`, starts ``S`` PS shard ranks and ``W`` worker
ranks (:mod:`runtime.launch`; or every rank under torchrun), and writes a
RunResult of the simulator's schema (evaluator ``runtime``).

Protocol (gloo point-to-point, :mod:`runtime.wire`): a worker pulls
(``PULL`` -> ``PARAMS``: parameters, its share, stop flag, bit width) from
shard 0 then the others, trains its share, and pushes every shard the
gradients of the tensors it holds (``PUSH``, packed at the bit width by
:mod:`runtime.quant`, exactly ``sim.quantization.packed_bytes`` per tensor).
Shard 0 coordinates (:mod:`runtime.ps`): the BSP barrier and commit, ASP/SSP
apply-on-arrival, failure detection by timeout, and ``rebalance`` of the
online scheduler with the same Observation type as the DES.

Multi-stage (layer-placement) plans run as a pipeline of stage replicas
(:mod:`runtime.stages`: the module cut into blocks, micro-batches, routing,
1F1B; :mod:`runtime.stage_worker`: one replica's loop): boundary activations,
their gradients and the targets go point-to-point (``ACT``, ``GRAD``,
``TARGET``), each replica pulls and pushes only its stage's tensors (the first
stage's embedding tables by touched row), and the PS commits under BSP.
"""
