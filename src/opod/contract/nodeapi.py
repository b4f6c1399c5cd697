"""The node protocol between a worker and its leader (CONTRACT.md §4).

Worker → leader: register once, then heartbeat every few seconds, on the
leader's listener. Leader → worker: load and unload models, sleep and resume,
tokenize, LoRA adapters and helper processes, on the worker's own listener.
Every call in both directions is signed (see :mod:`opod.contract.nodeauth`).

Fields are declared in wire order; their aliases are the JSON keys.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from opod.contract.wire import OMITEMPTY, OMITNIL, ZERO_TIME, GoTime, Nanoseconds, WireModel

WORKER_ERROR_HEADER = "X-Opod-Worker-Error"
"""Set by a worker on refusals of its own (not its engine's), which another worker may not share."""

# Paths. Worker → leader on the leader's listener; the rest on the worker's.
PATH_REGISTER = "/admin/v1/nodes/register"
PATH_HEARTBEAT = "/admin/v1/nodes/heartbeat"
PATH_MODEL_LOAD = "/v1/model/load"
PATH_MODEL_UNLOAD = "/v1/model/unload"
PATH_MODEL_SLEEP = "/v1/model/sleep"
PATH_MODEL_RESUME = "/v1/model/resume"
PATH_TOKENIZE = "/v1/tokenize"
PATH_ADAPTERS = "/v1/adapters"
PATH_ADAPTERS_LOAD = "/v1/adapters/load"
PATH_ADAPTERS_UNLOAD = "/v1/adapters/unload"
PATH_ADAPTERS_CHECK = "/v1/adapters/check"
PATH_PROCESS_START = "/v1/process/start"
PATH_PROCESS_STOP = "/v1/process/stop"
PATH_PROCESS_LIST = "/v1/process/list"
PATH_PROCESS_GET = "/v1/process/get"
PATH_PROCESS_LOGS = "/v1/process/logs"
PATH_PROCESS_FILE = "/v1/process/file"
PATH_PROCESS_UPLOAD = "/v1/process/upload"
# opod additions (docs/contract.md): a worker's logs, and its agent started again (engines keep serving).
PATH_LOGS = "/v1/opod/logs"
PATH_AGENT_RESTART = "/v1/opod/agent/restart"
# opod extensions (docs/contract.md): the worker's weights cache, listed and swept by the leader.
PATH_WEIGHTS = "/v1/weights"
PATH_WEIGHTS_DELETE = "/v1/weights/delete"

HEADER_FILE_PATH = "X-File-Path"

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"


class Status(StrEnum):
    """Status words of the node protocol's answers."""

    REGISTERED = "registered"
    OK = "ok"
    READY = "ready"
    UNLOADED = "unloaded"
    NOOP = "noop"
    SLEEPING = "sleeping"
    RESUMED = "resumed"
    UNSUPPORTED = "unsupported"


class ProcessStatus(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"
    CRASHLOOP = "crashloop"


class EngineStateWord(StrEnum):
    """What a worker's engine process is doing (``EngineState.state``)."""

    SERVING = "serving"
    STARTING = "starting"
    CRASH_LOOPING = "crash-looping"
    STOPPED = "stopped"


# --- worker → leader -------------------------------------------------------


class GPU(WireModel):
    name: str = Field("", alias="Name")
    vram_gb: int = Field(0, alias="VRAMGB")


class InventoryGPU(WireModel):
    """opod addition: one placeable device, a whole card or a MIG instance (docs/contract.md)."""

    index: int = 0
    label: str = ""
    name: str = ""
    gpu_class: str = Field("", alias="class")
    memory_mb: int = 0
    compute_capability: Annotated[str, OMITEMPTY] = ""
    uuid: Annotated[str, OMITEMPTY] = ""
    card: int = 0
    mig_profile: Annotated[str, OMITEMPTY] = ""
    healthy: bool = True
    why: Annotated[str, OMITEMPTY] = ""
    # opod addition: how the card is wired. Absent = none known (no NVLink, or a worker too old to say).
    nvlink_peers: Annotated[list[int] | None, OMITEMPTY] = None
    """The indices of the node's cards this card has NVLink to."""
    nvlink_domain: Annotated[str, OMITEMPTY] = ""
    """The multi-node NVLink domain the card belongs to."""
    fabric_state: Annotated[str, OMITEMPTY] = ""
    """Where joining that domain stands: ``joined``, ``joining`` or ``not joined``."""


class EngineInstall(WireModel):
    """opod addition: one engine this worker could run, and whether it can now (docs/contract.md)."""

    engine: str = ""
    version: Annotated[str, OMITEMPTY] = ""
    variant: Annotated[str, OMITEMPTY] = ""
    """The build: ``portable``, ``prebuilt``, ``override`` for llama.cpp; ``cuda`` or ``cpu`` for the Python engines."""
    state: str = ""
    """``ready``, ``installing``, ``failed`` or ``unsupported``."""
    detail: Annotated[str, OMITEMPTY] = ""
    """Why it is not ready, and what to install."""


class InventoryReport(WireModel):
    """opod addition: what the node views need beyond ``Capabilities`` (docs/contract.md).

    Sent in ``Capabilities.OpodInventory`` at registration and in ``Heartbeat.inventory`` when it
    changed; readers that do not know it ignore it as an unknown key.
    """

    gpus: Annotated[list[InventoryGPU] | None, OMITEMPTY] = None
    labels: Annotated[dict[str, str] | None, OMITEMPTY] = None
    engine_versions: Annotated[dict[str, str] | None, OMITEMPTY] = None
    agent_version: Annotated[str, OMITEMPTY] = ""
    features: Annotated[list[str] | None, OMITEMPTY] = None
    models_on_disk: Annotated[list[str] | None, OMITNIL] = None
    """``None``: not looked; ``[]``: none."""
    warnings: Annotated[list[str] | None, OMITEMPTY] = None
    declared: Annotated[bool, OMITEMPTY] = False
    """The GPUs come from a declared inventory file, not from the driver."""
    provision: Annotated[list[EngineInstall] | None, OMITEMPTY] = None
    """Each engine the worker can run, with its version and state; absent = not said."""
    # opod addition: the fabrics (InfiniBand, RoCE) the node is on. Absent = on none, or not said.
    fabrics: Annotated[dict[str, dict[str, str]] | None, OMITEMPTY] = None
    """fabric name → adapter → its port's state (``active``, or what the port is instead, ``down``)."""


class Capabilities(WireModel):
    """What a worker knows about its host. Capitalised keys: stored rows outlive binaries."""

    hostname: str = Field("", alias="Hostname")
    os: str = Field("", alias="OS")
    arch: str = Field("", alias="Arch")
    cpu_cores: int = Field(0, alias="CPUCores")
    ram_gb: int = Field(0, alias="RAMGB")
    gpus: list[GPU] | None = Field(None, alias="GPUs")
    role: Annotated[str, OMITEMPTY] = Field("", alias="Role")
    plan_revision: Annotated[int, OMITEMPTY] = Field(0, alias="PlanRevision")
    engine: Annotated[str, OMITEMPTY] = Field("", alias="Engine")
    # opod's keys (docs/contract.md): the filesystem holding the worker's weights, GiB. Omitted when
    # zero (unknown), so contract bodies stay byte-exact; other receivers ignore them as unknown keys.
    disk_free_gb: Annotated[int, OMITEMPTY] = Field(0, alias="DiskFreeGB")
    disk_total_gb: Annotated[int, OMITEMPTY] = Field(0, alias="DiskTotalGB")
    # opod's key (docs/contract.md): devices (MIG instances too), labels and software; absent = not said.
    inventory: Annotated[InventoryReport | None, OMITNIL] = Field(None, alias="OpodInventory")


def encode_hardware(caps: Capabilities) -> str:
    """The ``hardware_json`` string: compact, Go key order and escaping; compared byte for byte."""
    return caps.to_json()


def decode_hardware(text: str) -> Capabilities:
    """Parse ``hardware_json``; an empty string is the zero value, malformed text an error."""
    if text == "":
        return Capabilities()
    return Capabilities.from_wire(text)


class RegisterRequest(WireModel):
    """Body of register. Every key is always sent."""

    id: str = ""
    hostname: str = ""
    os: str = ""
    arch: str = ""
    ram_gb: int = 0
    address: str = ""
    hardware_json: str = ""
    boot_id: str = ""

    def hardware(self) -> Capabilities:
        return decode_hardware(self.hardware_json)


class RegisterResponse(WireModel):
    status: str = ""
    id: str = ""


class EngineLoad(WireModel):
    """One engine sample; the leader aggregates these into ``/loadz``."""

    kv_used_pct: float = 0.0
    queue_depth: int = 0
    tokens_per_s: float = 0.0
    prefix_hit_pct: float = 0.0
    sampled_at: int = 0


class EngineState(WireModel):
    state: str = ""
    restarts: Annotated[int, OMITEMPTY] = 0
    since: Annotated[str, OMITEMPTY] = ""
    detail: Annotated[str, OMITEMPTY] = ""

    @property
    def word(self) -> EngineStateWord | None:
        """The state, or ``None`` for a word from a newer worker: "no statement", not failure."""
        try:
            return EngineStateWord(self.state)
        except ValueError:
            return None


class KVBlocks(WireModel):
    """One heartbeat's worth of prefix-cache changes on one worker."""

    seq: int = 0
    block_size: int = 0
    stored: Annotated[list[str] | None, OMITEMPTY] = None
    removed: Annotated[list[str] | None, OMITEMPTY] = None
    cleared: Annotated[bool, OMITEMPTY] = False


class GPUSensor(WireModel):
    """opod addition: one GPU's sensors from NVML, at one heartbeat; absent keys were not readable."""

    index: int = 0
    temp_c: Annotated[float | None, OMITNIL] = None
    memory_temp_c: Annotated[float | None, OMITNIL] = None
    power_w: Annotated[float | None, OMITNIL] = None
    power_limit_w: Annotated[float | None, OMITNIL] = None
    util_percent: Annotated[float | None, OMITNIL] = None
    mem_util_percent: Annotated[float | None, OMITNIL] = None
    memory_used_mb: Annotated[float | None, OMITNIL] = None
    memory_total_mb: Annotated[float | None, OMITNIL] = None
    sm_clock_mhz: Annotated[float | None, OMITNIL] = None
    ecc_uncorrected: Annotated[int | None, OMITNIL] = None
    pcie_replays: Annotated[int | None, OMITNIL] = None
    retired_pages_sbe: Annotated[int | None, OMITNIL] = None
    retired_pages_dbe: Annotated[int | None, OMITNIL] = None
    retire_pending: Annotated[bool | None, OMITNIL] = None
    remapped_rows_correctable: Annotated[int | None, OMITNIL] = None
    remapped_rows_uncorrectable: Annotated[int | None, OMITNIL] = None
    remap_pending: Annotated[bool | None, OMITNIL] = None
    remap_failure: Annotated[bool | None, OMITNIL] = None


class HostLoad(WireModel):
    """opod addition: the worker's host as measured at one heartbeat (the real machine, declared inventory or not)."""

    cpus: Annotated[int, OMITEMPTY] = 0
    cpu_percent: Annotated[float | None, OMITNIL] = None
    """Busy share of all CPUs since the previous heartbeat; absent on the first."""
    load1: Annotated[float | None, OMITNIL] = None
    load5: Annotated[float | None, OMITNIL] = None
    load15: Annotated[float | None, OMITNIL] = None
    memory_used_bytes: Annotated[int, OMITEMPTY] = 0
    memory_total_bytes: Annotated[int, OMITEMPTY] = 0
    cpu_temp_c: Annotated[float | None, OMITNIL] = None
    gpus: Annotated[list[GPUSensor] | None, OMITEMPTY] = None


class HeldReplica(WireModel):
    """opod addition: one engine on a worker as the leader's reconciler asked for it (the replica fields of its load).

    A restarted leader adopts the replicas its workers report rather than placing them again.
    """

    replica: str = ""
    profile: Annotated[int, OMITEMPTY] = 0
    fingerprint: Annotated[str, OMITEMPTY] = ""
    devices: Annotated[list[int] | None, OMITEMPTY] = None
    rank: Annotated[int, OMITEMPTY] = 0
    ranks: Annotated[int, OMITEMPTY] = 0
    """How many nodes the replica spans; 0 = one."""


class Heartbeat(WireModel):
    """Body of heartbeat.

    ``loaded_models`` is always sent: ``None`` (``null``) means the engine did
    not answer in time and the heartbeat carries no report; ``[]`` means the
    engine answered and holds nothing. Never turn a failed query into ``[]``.
    """

    id: str = ""
    loaded_models: list[str] | None = None
    boot_id: str = ""
    resident_models: Annotated[list[str] | None, OMITNIL] = None
    sleeping: Annotated[bool, OMITEMPTY] = False
    load: Annotated[EngineLoad | None, OMITNIL] = None
    engine: Annotated[EngineState | None, OMITNIL] = None
    kv_blocks: Annotated[KVBlocks | None, OMITNIL] = None
    # opod addition (CONTRACT.md §2.10 names Heartbeat.Slots without a key):
    # how many requests the engine serves at once; 0 = not said.
    slots: Annotated[int, OMITEMPTY] = 0
    # opod addition: model id → why its load failed on this worker, so the
    # leader can say so and try elsewhere instead of waiting.
    load_errors: Annotated[dict[str, str] | None, OMITEMPTY] = None
    # opod addition: model id → how far its load has come ("fetching weights 40%").
    load_progress: Annotated[dict[str, str] | None, OMITEMPTY] = None
    # opod addition: model id → its engine's loopback URL. A leader on the same machine
    # calls the engine directly instead of through the worker's listener (one hop less).
    engine_urls: Annotated[dict[str, str] | None, OMITEMPTY] = None
    # opod addition: free GiB where the worker keeps weights, now (Capabilities' DiskFreeGB is as of
    # registration); 0 = not said.
    disk_free_gb: Annotated[int, OMITEMPTY] = 0
    # opod addition: model id → the state of the engine process serving it (serving, starting,
    # crash-looping, stopped; its restarts and why it last ended). ``engine`` is one word for all of
    # them; this says which model's engine crashed, so the leader keeps the others serving.
    # Absent = not said.
    model_engines: Annotated[dict[str, EngineState] | None, OMITEMPTY] = None
    # opod addition: model id → the context one request may use on the engine serving it, in tokens,
    # as that engine was started (it can be less than the catalog's window). Absent = not said.
    model_context: Annotated[dict[str, int] | None, OMITEMPTY] = None
    # opod addition: the worker's inventory again, sent only when it changed since registration
    # (models on disk, warnings, a GPU turned unhealthy). Absent = unchanged.
    inventory: Annotated[InventoryReport | None, OMITNIL] = None
    # opod addition: the host's CPU, load averages, memory and sensors at this heartbeat. Absent = not said.
    host_load: Annotated[HostLoad | None, OMITNIL] = None
    # opod addition: model id → the replica its engine here is, for every engine a reconciler placed
    # (loading, serving or following as a rank of a replica across nodes). Absent = none, or not said.
    replicas: Annotated[dict[str, HeldReplica] | None, OMITEMPTY] = None


class HeartbeatResponse(WireModel):
    status: str = ""
    # opod additions: what the management API set on this node, on every answer, so a worker that
    # restarts (or missed one) converges on it. Absent = nothing set.
    wanted_version: Annotated[str, OMITEMPTY] = ""
    """The release the operator wants this node's agent to run (``POST /api/v1/nodes/{id}/upgrade``)."""
    engine_builds: Annotated[dict[str, str] | None, OMITEMPTY] = None
    """engine → the build chosen for this node (``auto``, ``none`` or a build name; ``POST /api/v1/nodes/{id}/engines``)."""


# --- leader → worker -------------------------------------------------------


class TokenizeMessage(WireModel):
    role: str = ""
    content: str = ""


class TokenizeRequest(WireModel):
    model: str = ""
    messages: Annotated[list[TokenizeMessage] | None, OMITEMPTY] = None
    prompt: Annotated[str, OMITEMPTY] = ""
    max_tokens: Annotated[int, OMITEMPTY] = 0


class TokenizeResponse(WireModel):
    tokens: list[int] | None = None


class Adapter(WireModel):
    """One element of the ``OPOD_ADAPTERS`` list; served as ``<model>:<name>``."""

    name: str = ""
    source: str = ""
    rank: Annotated[int, OMITEMPTY] = 0


class LoadModelRequest(WireModel):
    """The catalog source of a model; the worker resolves the engine-native name."""

    id: str = ""
    ollama_name: str = ""
    repo: str = ""
    file: Annotated[str, OMITEMPTY] = ""
    path: str = ""
    pin: bool = False
    # opod addition: engine flags for this load (for example the RPC parts of a
    # sharded model: {"rpc": "10.0.0.2:50052,10.0.0.3:50052"}); absent = none.
    flags: Annotated[dict[str, Any] | None, OMITEMPTY] = None
    # opod additions: what the leader's reconciler gave this replica (absent = the worker's own choice).
    replica: Annotated[str, OMITEMPTY] = ""
    devices: Annotated[list[int] | None, OMITEMPTY] = None
    """GPU indices on this node for the engine (CUDA_VISIBLE_DEVICES); absent = none given (a CPU replica)."""
    tp: Annotated[int, OMITEMPTY] = 0
    pp: Annotated[int, OMITEMPTY] = 0
    engine: Annotated[str, OMITEMPTY] = ""
    args: Annotated[list[str] | None, OMITEMPTY] = None
    """Extra engine command-line arguments from the model's profile."""
    env: Annotated[dict[str, str] | None, OMITEMPTY] = None
    rank: Annotated[int, OMITEMPTY] = 0
    """This node's rank in a replica across nodes; rank 0 serves."""
    peers: Annotated[list[str] | None, OMITEMPTY] = None
    """A replica across nodes: every rank's node address (host:port of its worker), rank 0 first."""
    profile: Annotated[int, OMITEMPTY] = 0
    """The index of the definition's profile the replica was placed by."""
    fingerprint: Annotated[str, OMITEMPTY] = ""
    """A digest of the definition the replica was placed from (a later definition makes it stale)."""
    adapters: Annotated[list[Adapter] | None, OMITEMPTY] = None
    """opod addition: the LoRA adapters of the model's definition, attached once it serves; absent = none."""
    revision: Annotated[str, OMITEMPTY] = ""
    """The Hub commit ``repo``'s file is fetched at, so two commits' weights coexist (an update beside the old)."""


class LoadModelResponse(WireModel):
    status: str = ""
    model: str = ""


class UnloadModelRequest(WireModel):
    id: str = ""
    ollama_name: str = ""
    repo: str = ""
    path: str = ""


class UnloadModelResponse(WireModel):
    status: str = ""
    model: Annotated[str, OMITEMPTY] = ""
    engine: Annotated[str, OMITEMPTY] = ""
    reason: Annotated[str, OMITEMPTY] = ""


class SleepResponse(WireModel):
    status: str = ""
    engine: str = ""
    reason: Annotated[str, OMITEMPTY] = ""


class LoadAdapterRequest(WireModel):
    base: str = ""
    name: str = ""
    source: str = ""
    rank: Annotated[int, OMITEMPTY] = 0
    definition: Annotated[bool, OMITEMPTY] = False
    """opod addition: the adapter is in its base model's definition, so it goes with its base and comes back with it
    (a manager's own adapters must be unloaded before their base)."""


class AdapterFacts(WireModel):
    """opod addition: what a worker read of an adapter before anything attaches it (``POST /v1/adapters/check``)."""

    name: str = ""
    source: str = ""
    rank: Annotated[int, OMITEMPTY] = 0
    """The adapter's rank (``r`` of its ``adapter_config.json``)."""
    base_model: Annotated[str, OMITEMPTY] = ""
    """The model it was trained on, as its config names it (``base_model_name_or_path``)."""
    architecture: Annotated[str, OMITEMPTY] = ""
    """The architecture it was trained for, when its config says (PEFT's ``auto_mapping.base_model_class``)."""
    max_rank: Annotated[int, OMITEMPTY] = 0
    """The largest rank the engine serving the base was started for."""
    base_architecture: Annotated[str, OMITEMPTY] = ""
    """The architecture of the weights the base is served from, when the worker can read it; absent = unknown."""


class UnloadAdapterRequest(WireModel):
    base: str = ""
    name: str = ""


class AdapterResponse(WireModel):
    status: str = ""
    model: str = ""


class HeldAdapter(WireModel):
    id: str = ""
    name: str = ""
    source: str = ""


class ProcessSpec(WireModel):
    """A helper process (a llama.cpp RPC part). Capitalised keys, nothing omitted."""

    id: str = Field("", alias="ID")
    command: str = Field("", alias="Command")
    args: list[str] | None = Field(None, alias="Args")
    env: dict[str, str] | None = Field(None, alias="Env")
    work_dir: str = Field("", alias="WorkDir")
    health_port: int = Field(0, alias="HealthPort")
    health_host: str = Field("", alias="HealthHost")
    log_lines: int = Field(0, alias="LogLines")
    health_path: str = Field("", alias="HealthPath")
    ready_timeout: Nanoseconds = Field(0, alias="ReadyTimeout")
    restart: bool = Field(False, alias="Restart")
    max_restarts: int = Field(0, alias="MaxRestarts")
    restart_backoff: Nanoseconds = Field(0, alias="RestartBackoff")


class ProcessInfo(WireModel):
    id: str = ""
    command: str = ""
    args: list[str] | None = None
    pid: int = 0
    started_at: GoTime = ZERO_TIME
    status: str = ""
    exit_err: Annotated[str, OMITEMPTY] = ""
    address: Annotated[str, OMITEMPTY] = ""
    restarts: Annotated[int, OMITEMPTY] = 0


class StartProcessError(WireModel):
    """502 body of process start: refused before anything spawned."""

    error: str = ""
    info: ProcessInfo | None = None


class StopProcessRequest(WireModel):
    id: str = ""


class UploadResponse(WireModel):
    path: str = ""
    sha256: str = ""
    size: int = 0


# --- opod extension: the weights cache ------------------------------------------


class CachedFile(WireModel):
    """One file in a worker's weights cache; ``path`` is relative to the cache's root."""

    path: str = ""
    bytes: int = 0


class WeightsCache(WireModel):
    """``GET /v1/weights``: what the worker's weights cache holds, and which of it its engines use now."""

    root: str = ""
    """The cache's absolute path on the worker (``<home>/models``)."""
    files: list[CachedFile] | None = None
    in_use: list[str] | None = None
    """Paths (relative to ``root``) a model this worker serves or is loading needs: never deleted."""


class DeleteWeightsRequest(WireModel):
    """``POST /v1/weights/delete``: files to remove, relative to the cache's root."""

    paths: list[str] | None = None


class DeleteWeightsResponse(WireModel):
    files: int = 0
    bytes: int = 0
    refused: Annotated[dict[str, str] | None, OMITEMPTY] = None
    """path → why it was kept (outside the cache, in use, not a file)."""
