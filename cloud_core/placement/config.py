"""Engine configuration: score weights, data-move prices, staleness, solver limits."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Weights of the cost terms (all terms are in $/hour before weighting)."""

    price: float = 1.0
    energy: float = 1.0
    carbon: float = 1.0
    data: float = 1.0
    latency: float = 0.01  # $/hour for using the whole SLA (margin 0)
    balance: float = 0.01  # $/hour for filling a node to 100 %
    # Soft node affinity: $/hour for matching none of a workload's preferred terms (a node
    # matching all of them pays 0, one matching half the weight pays half). 0.05 $/h is a
    # 20 % price gap on a quarter of a $1/h node, or the whole latency and balance terms
    # five times over: a preferred node wins over a slightly cheaper, emptier or closer one
    # but not over one that saves real money. A hard constraint always wins whatever this
    # is: filters remove nodes before any cost is looked at, so no cost can buy them back.
    affinity: float = 0.05
    # Per PreferNoSchedule taint the workload doesn't tolerate ($/hour). The same scale as a
    # full preference: "avoid if you can" weighs like "prefer if you can", so a preferred
    # node with one such taint nets out and the other terms decide.
    taint: float = 0.05
    # ScheduleAnyway topology spread ($/hour for the fullest domain, 0 for the emptiest):
    # the same scale as a preference, so spreading wins over small price differences.
    spread: float = 0.05
    # Preferred inter-pod (anti-)affinity ($/hour for the node with the lowest normalised
    # InterPodAffinity score, 0 for the highest): the same scale as soft node affinity, as
    # kube-scheduler weighs NodeAffinity and InterPodAffinity alike (2 each).
    pod_affinity: float = 0.05


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything tunable about placement; the defaults are what the core runs with."""

    weights: ScoreWeights = field(default_factory=ScoreWeights)
    # Scoring policy (a workload may choose its own with the cfnet.io/placement-policy
    # annotation): "cost" packs by price/energy/carbon (the solver); "spread" places pod by
    # pod with kube-scheduler's default scores (least-allocated + balanced), see scores.py.
    policy: str = "cost"
    # InterPodAffinity's hardPodAffinityWeight (kube's default 1, 0..100): a running pod whose
    # REQUIRED pod affinity selects the newcomer adds this to its domain's score (0: off).
    hard_pod_affinity_weight: int = 1
    carbon_price_per_g: float = 0.0001  # $100 per tonne CO2
    intra_region_per_gb: float = 0.01
    inter_region_per_gb: float = 0.09
    data_amortize_hours: float = 24.0
    # Link figures older than this are inflated by ``stale_factor`` (less confidence,
    # so a stale link needs more margin); older than ``expire_after_s`` they count as absent.
    stale_after_s: float = 60.0
    stale_factor: float = 1.5
    expire_after_s: float = 600.0
    # Solver: CP-SAT runs on coupled batches with at most this many (class, node) arcs.
    use_cpsat: bool = True
    cpsat_max_arcs: int = 4000
    # The whole-batch CP-SAT polish (it proves small coupled batches optimal): the Kubernetes
    # schedulers turn it off unless --exact-packing (seconds per 500-pod batch). The cost
    # neighbourhoods (bounded, small CP-SAT models) and the count-first ones run either way.
    cpsat_polish: bool = True
    # With cpsat_polish off, batches of at most this many pods that left out pods an allowed
    # node could hold still get the whole-batch polish, with this much work, kept only when
    # strictly better (more pods, or the same for less): small coupled batches (GPU gangs,
    # mixed shapes on few nodes) reach the count CP-SAT proves (measured: the quality
    # benchmark's gpu 40 x 10 seed 2, 36 -> 38 pods, 0.2 s CPU).
    small_polish_max_pods: int = 100
    small_polish_deterministic_time: float = 0.3
    # Batches of at most this many pods x nodes that left pods out get the exact step
    # (exact.py): the whole batch as one CP-SAT model, pod affinity, spread, host ports,
    # extended resources and pods per node included, from the engine's answer, with this
    # much work; kept only when it places more pods (or as many for less) and validates.
    exact_max_pairs: int = 24_000
    exact_deterministic_time: float = 0.5  # the count
    exact_cost_deterministic_time: float = 0.5  # the cost at that count
    exact_workers: int = 1  # CP-SAT workers of the exact step (one: the same on any load)
    # On the same batches, after the exact step: a pod-by-pod class's left-out pod takes a
    # node that suits it when at most this many pods of the solver's classes there can
    # move to a node with room for them (repair.py; validated); 0: no such repair.
    eject_max_moves: int = 2
    # The step's CPU budget on those same batches (pods x nodes <= exact_max_pairs), on the
    # Kubernetes path (budget.py): the deciding thread's CPU (time.thread_time) from the
    # step's start, ``step_cpu_base_s + step_cpu_per_pod_s x pods``, at most
    # ``step_cpu_max_s``; ``step_cpu_after_per_pod_s x pods`` of it is left for what follows
    # the engine (its decisions, the loop's validation, the bindings handed out). The CP-SAT
    # neighbourhoods (count, then cost) start none after ``step_search_share`` of the
    # engine's share (or earlier: StepClock.search_end_for); the exact step runs in what is
    # left (at least ``step_exact_min_s``, else it is skipped). CP-SAT gets
    # ``step_work_per_cpu_s`` units of deterministic time per CPU second left (measured on
    # the neighbourhoods' and the exact step's models: 0.14-0.43). 0.85 s: on a quiet
    # machine the scheduling loop's step of the tight benchmark's 339 pods holds the loop
    # under 1 s of wall clock (the loop's thread takes the step's CPU; the binder's threads
    # share the GIL). A machine too loaded to give the step its CPU is bounded by a
    # wall-clock safety net, ``step_wall_factor`` x the CPU budget (at least
    # ``step_wall_min_s``): 1 s, so that a loaded machine holds the loop about as long as an
    # idle one and loses only the CP-SAT steps it has no time for (at 5 x the budget, a
    # machine at load 6-9 on 2 cores held it 3 s). ``step_cpu_max_s=0``: no step budget
    # (work bounds alone).
    step_cpu_base_s: float = 0.1
    step_cpu_per_pod_s: float = 0.008
    step_cpu_max_s: float = 0.85
    step_cpu_after_per_pod_s: float = 0.0004
    step_search_share: float = 0.7
    # ... and ``step_search_share_short`` of it for the cost neighbourhoods while pods an
    # allowed node could hold are still out: the exact step, which places more where it
    # can, gets the rest (measured: the gpu family's 200 x 50 placed 198 of the 199 the
    # reference proves when the cost neighbourhoods took the search's whole share)
    step_search_share_short: float = 0.3
    step_exact_min_s: float = 0.05
    step_work_per_cpu_s: float = 0.15
    step_wall_factor: float = 1.0
    step_wall_min_s: float = 1.0
    # CP-SAT is bounded by work (its deterministic time, one worker, a fixed seed), never by
    # the clock: the same snapshot and config give the same placement on any machine load.
    # The wall-clock cap is a safety net far above what the work limit takes; when it is hit
    # the answer may depend on load, and stats["cpsat_wall_cap_hits"] says so.
    cpsat_deterministic_time: float = 2.0
    cpsat_wall_cap_s: float = 30.0
    cpsat_seed: int = 1
    flow_rounds: int = 4  # flow rounds on the residual capacity (over-packing, pruning)
    flow_arc_slack: float = 3.0  # per class, arcs to the cheapest nodes holding 3x its pods
    flow_min_arcs: int = 32
    # Count first when capacity is tight: if pods that fit an allowed node are left out, an
    # ejection repair and a largest-first tightest-fit packing try to place them.
    pack: bool = True
    # A batch asking for more than this share of some resource of the nodes it may use is
    # tight: packing goes first (and the flow too, for batches up to pack_flow_max_pods).
    pack_tight: float = 0.7
    pack_flow_max_pods: int = 1000
    pack_rescue_share: float = 0.01  # loose batch: re-pack if more than this share is out
    pack_lookahead: float = 10.0  # weight of the expected demand of the pods still to come
    # The cost descent and slot flow also after the flow route, when the flow was not
    # exact (rejections repaired) and the batch has at most pack_flow_max_pods pods.
    flow_descent: bool = True
    slot_rounds: int = 3  # cost rounds after packing: pods exchange slots they fit in
    pack_cost: float = 0.0  # weight of a node's cost above the pod's cheapest, relative
    pack_big: float = 0.6  # second packing order: pods this large (share of a mean node) first
    pack_repair_nodes: int = 8  # nodes tried per left-out pod when ejecting one pod
    pack_work: int = 200_000  # steps (node scans), a bound by work, not by the clock
    # Large neighbourhood search (count first): neighbourhoods of a left-out pod, each
    # ``lns_near`` nodes closest to fitting it plus ``lns_slack`` with the most room.
    lns_iterations: int = 60
    lns_near: int = 3
    lns_slack: int = 6
    lns_grow: int = 1  # one more slack node per failed try of the same pod
    # neighbourhoods per left-out class before it is given up: a class no neighbourhood
    # places in 8 tries (growing ones, the GPU ring from the second) took the search's time
    # from the cost neighbourhoods at 20 (measured: the quality benchmark's SLA 200 x 40,
    # where the count is already the reference's, 3.8 % above its cost at 20, 0.2 % at 8;
    # tight 111-333 as many pods, the same cost or less)
    lns_tries: int = 8
    lns_extra_classes: int = 20  # left-out classes offered to one neighbourhood
    lns_deterministic_time: float = 0.05
    # A GPU pod that failed once: up to this many nodes with GPUs join its neighbourhood (most
    # free GPUs first), with room for their pods, solved with more work (GPUs are packed to
    # the last one, so freeing an 8-GPU node moves GPU pods across many nodes).
    lns_gpu_ring: int = 30
    lns_gpu_deterministic_time: float = 0.2
    cost_lns_iterations: int = 100  # cost neighbourhoods after packing (largest regret first)
    # ... each with this many nodes with the most room for the pods it displaces (a pod that
    # pays a GPU node's price reaches a cpu node only if that node's pods move on), solved
    # with this much work. Measured on the tight benchmark (300 x 60, seeds 1-3; 100 x 20):
    # 0.3-6 % cheaper, 2-3x the CPU time of those batches (0 nodes: the neighbourhood is the
    # pod's node and its cheapest allowed ones, as before).
    cost_lns_slack: int = 6
    cost_lns_passes: int = 3  # passes over the regrets while one lowers the cost
    cost_lns_deterministic_time: float = 0.1
    # ... and within a step budget, once no pod an allowed node could hold is left out (the
    # count settled: the cost neighbourhoods have the search's whole share), this much work
    # each and this many passes: more neighbourhoods in the same CPU. A tight 111 x 20
    # batch's 40-class neighbourhoods take 0.1 units in ~0.1 s, nine of them in the budget;
    # at 0.02 units, 26 (measured on the tight family, 40-300 pods, seeds 1-5: mean -0.65 %,
    # 111 x 20 seed 3 from +3.2 % to +0.8 % of the reference). Two at a time
    # (``cost_lns_threads``), 0.04: at 0.02 the tight family's 80-120 pods priced as low on
    # the mean, with single batches up to +11 % of the reference (+3.9 % at 0.04, seeds
    # 1-12). While pods are out the count comes first and the work stays 0.1 (mixed 300 x 75
    # seed 1 places one fewer at 0.02).
    cost_lns_settled_deterministic_time: float = 0.04
    cost_lns_settled_passes: int = 8
    # Once no pod an allowed node could hold is out, cost neighbourhoods solved at a time
    # (1 or 2, at most the CPUs the process may run on): the second on a helper thread while
    # CP-SAT lets go of the GIL. The step's budget counts the deciding thread's CPU and its
    # waits for the helper: the same wall time, up to twice the CPU (neighbourhoods.cost_lns).
    cost_lns_threads: int = 2
    # ... the second being the first among the next this many of the pass whose pod's node
    # and cheapest nodes are apart from the first's nodes (its roomy nodes then chosen apart
    # too). Measured (tight family, 80-120 pods, seeds 1-20, 60 batches, 0.02 units): above 2 %
    # of the reference on 8 batches at 64, on 15 at 8 (120 x 24 seed 9: 4 pairs among 32
    # neighbourhoods at 8).
    cost_lns_pair_window: int = 64
    # Cost descent after packing (count kept exactly): a pod paying more than
    # ``descent_regret`` of its cost above its cheapest allowed node tries a move to a cheaper
    # node with room, a swap with a pod there, or a chain (that pod to its cheapest node with
    # room); improving moves only, ``descent_rounds`` passes, ``descent_work`` pods looked at.
    descent_rounds: int = 8
    descent_work: int = 20_000
    descent_regret: float = 0.25
    # Its tables hold one integer cost per (class, node): above this many cells (about 20
    # bytes each at the peak, 200 MB here) the descent is skipped; stats["descent_skipped"].
    descent_max_cells: int = 10_000_000
    cost_scale: float = 1e5  # $/hour -> integer units for the solvers
    # The step's budget (budget.py) for the CP-SAT neighbourhoods (count and cost): their
    # deterministic time summed over the batch, ``budget_work_base + budget_work_per_pod x
    # pods`` (counted, not timed: the same answer on any load). ``budget_wall_base_s`` > 0
    # adds a wall-clock deadline, ``budget_wall_base_s + budget_wall_per_pod_s x pods`` from
    # the step's start, past which no sub-solve starts and a running one is cut short (the
    # best answer so far is kept; the answer may then depend on load). ``budget=False``:
    # the neighbourhoods are bounded by their own counts only.
    budget: bool = False
    budget_work_base: float = 0.05
    budget_work_per_pod: float = 0.002
    budget_wall_base_s: float = 0.0
    budget_wall_per_pod_s: float = 0.003
