"""The OpenAI-compatible ``/v1`` routes: plain Starlette handlers on the hot path.

Each request: a request id, the key check (memory), a body read under the
route's cap, the model, the route's rules (``opod.gateway.validate``), then the
relay. Unknown request fields travel to the engine untouched; ``model``,
``stream`` and ``stream_options`` are opod's. Every other ``/v1`` path answers
OpenAI's error shape too: 405 with ``Allow`` for a known path, 404 otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from opod.access.keytable import KeyEntry, KeyTable
from opod.contract.adminapi import AdmissionClass, PlanSnapshot
from opod.fleet.affinity import worth_placing
from opod.fleet.canaries import CanaryBook
from opod.fleet.federation import Federation
from opod.fleet.models import KnownModel, ModelRegistry
from opod.fleet.router import RouteRequest, RoutingPolicy
from opod.fleet.state import Fleet
from opod.gateway.admission import Admission, Stopping, resolve_class
from opod.gateway.budgets import Budgets
from opod.gateway.caller import Endpoint, InProcessCaller
from opod.gateway.canary import CanarySplit
from opod.gateway.embeddings import cut_embeddings
from opod.gateway.exchange import TIMING_HEADER, Exchange
from opod.gateway.guard import GuardPlan, GuardPolicies
from opod.gateway.guardrails import Guardrails
from opod.gateway.kept_bodies import NO_STORE, BodyKeeping
from opod.gateway.meter import Chains, Meter, UsageRecorder
from opod.gateway.overflow import Overflow
from opod.gateway.prefix import PrefixHasher
from opod.gateway.profiles import RoutingProfiles, routing_policy
from opod.gateway.promptsize import PromptSize, TemplateCost, asked_limit, completion_bound, default_limit, prompt_size
from opod.gateway.relay import Relay, RelayCall, RelayedAnswer
from opod.gateway.responses import RESPONSES_PATH, responses_endpoint
from opod.gateway.routes import ANY_METHOD, ROUTES, TRANSLATED_RESPONSES, UNSUPPORTED, RouteSpec, json_object_as_schema
from opod.gateway.stats import PROBE_HEADER, GatewayStats
from opod.gateway.templatecost import TemplateCosts
from opod.gateway.traits import TraitsBook
from opod.gateway.usagecount import DecodeRates, PromptCounter
from opod.gateway.validate import (
    check_content_type,
    require_model,
)
from opod.http import fastjson
from opod.http.errors import (
    BadRequest,
    GatewayError,
    MethodNotAllowed,
    ModelNotFound,
    NoCapacity,
    NotSupported,
    UnknownRoute,
    error_response,
)
from opod.http.fastpath import ReadRequest, headers_of, read_whole
from opod.http.inbound import json_object, read_body, sane_request_id
from opod.settings.schema import Generation
from opod.snapshots.policy import PolicyView

PROBE = PROBE_HEADER.encode()
TIMING = TIMING_HEADER.lower().encode()
Handler = Callable[[Request], Awaitable[Response]]


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class Policies(Protocol):
    """The files a manager mounts, as the gateway reads them per request (``opod.snapshots.service.Snapshots``)."""

    def current_policy(self) -> PolicyView | None:
        """The mounted policy's view, or ``None`` without one."""

    def current_plan(self) -> PlanSnapshot | None:
        """The mounted plan, or ``None``: with one, only its model is served."""


Demand = Callable[[str], Awaitable[None] | None]
"""Called with each request's model before it is admitted: ``None`` to go on, or something to await first
(the leader's reconciler starting a replica of an on-demand model that nothing serves)."""


class Gateway:
    def __init__(
        self,
        *,
        fleet: Fleet,
        models: ModelRegistry,
        keys: KeyTable,
        relay: Relay,
        admission: Admission,
        usage: UsageRecorder,
        prefix: PrefixHasher,
        policies: Policies,
        guardrails: Guardrails,
        prompts: PromptCounter,
        templates: TemplateCosts | None = None,
        require_keys: bool = True,
        demand: Demand | None = None,
        tenancy: Chains | None = None,
        budgets: Budgets | None = None,
        bodies: BodyKeeping | None = None,
        profiles: RoutingProfiles | None = None,
        default_max_tokens: Callable[[], int] | None = None,
        federation: Federation | None = None,
        canaries: CanaryBook | None = None,
        guard: GuardPolicies | None = None,
    ) -> None:
        self.fleet = fleet
        self.demand = demand
        """Told of every request's model; may answer a wait (an on-demand model's replica starting)."""
        self.models = models
        self.keys = keys
        self.relay = relay
        self.overflow = Overflow(models, fleet, relay, federation)
        """A model's fallbacks and the federation's peers."""
        self.canary = CanarySplit(canaries, fleet, relay)
        """Each request's group of its model's canary or the policy's plan revisions; candidates hidden."""
        self.admission = admission
        """Engine slots by class and team; the leader swaps its policy with ``admission.configure``."""
        self.prefix = prefix
        """A request's block hashes for prefix routing."""
        self.policies = policies
        self.guardrails = guardrails
        """The policy's webhooks."""
        self.guard = guard
        """The settings' guard policies, run here; ``None``: none apply (a gateway without the cluster's rules)."""
        self.prompts = prompts
        """Counts the prompts a reservation needs, and those of streams cut short, for their usage rows."""
        self.templates = templates
        """Each model's chat template cost, for the budgets' bound of a chat without a count on its way."""
        self.require_keys = require_keys
        self.budgets = budgets
        """Prices each request and holds its reservation against its scopes' budgets."""
        self.profiles = profiles
        """The routing of each key's routing profile; ``None``: every key is routed by the policy's."""
        self.bodies = bodies
        """Keeps requests' bodies and answers where the retention settings say so; ``None``: never kept."""
        self.default_max_tokens = default_max_tokens or (lambda: Generation().default_max_tokens)
        """The settings' ``generation.default_max_tokens``: the limit of a request that names none."""
        self.meter = Meter(usage, GatewayStats(), prompts, budgets, DecodeRates(), tenancy)
        """What every request's record reports to: one usage row per request, the counters, the budgets."""
        self._routing: tuple[PolicyView | None, RoutingPolicy] = (None, RoutingPolicy())
        self.model_traits = TraitsBook(models, fleet)
        """model → what :meth:`traits` made, with the objects it was made from."""
        self._in_process: dict[tuple[str, str], Endpoint] | None = None
        """The hot handlers, made once, for :meth:`serve_as`."""

    @property
    def stats(self) -> GatewayStats:
        return self.meter.stats

    def routes(self) -> list[Route]:
        """The hot routes, ``GET /v1/models/{id}``, then every other ``/v1`` path (last: it matches them all)."""
        hot = [Route(path, handler, methods=[method]) for (method, path), handler in self.handlers().items()]
        return [
            *hot,
            Route("/v1/models/{model:path}", self.retrieve_model, methods=["GET"]),
            Route("/v1", self.unknown_route, methods=ANY_METHOD),
            Route("/v1/{rest:path}", self.unknown_route, methods=ANY_METHOD),
        ]

    def handlers(self) -> dict[tuple[str, str], Handler]:
        """(method, path) → handler, for :class:`opod.http.fastpath.FastPath`."""
        return {("GET", "/v1/models"): self.list_models, **self.endpoints()}

    def endpoints(self) -> dict[tuple[str, str], Endpoint]:
        """The ``POST`` routes, which a request made in process takes too (:meth:`serve_as`)."""
        out = {("POST", spec.path): self._endpoint(spec) for spec in ROUTES}
        # The Responses API, translated onto chat completions; its usage rows name their own protocol.
        out[("POST", RESPONSES_PATH)] = responses_endpoint(
            self._endpoint(TRANSLATED_RESPONSES, "openai.responses"), self.authenticate
        )
        return out

    def _endpoint(self, spec: RouteSpec, protocol: str = "") -> Endpoint:
        protocol = protocol or "openai" + spec.path.removeprefix("/v1").replace("/", ".")

        async def endpoint(request: Request, caller: InProcessCaller | None = None) -> Response:
            headers = headers_of(request)
            request_id = sane_request_id(headers.get(b"x-request-id"))
            policy = self.policies.current_policy()
            access_log = policy is not None and policy.access_log is True
            exchange = Exchange(self.meter, request_id, protocol, PROBE in headers, access_log)
            try:
                response = await self.serve(request, headers, spec, exchange, policy, caller)
            except GatewayError as err:
                exchange.refused(err.status)
                return error_response(err, request_id)
            except BaseException as why:
                exchange.abandoned(why)  # its client left, or it failed, before an answer
                raise
            timing = exchange.server_timing()  # last: the answer's headers leave as the handler returns
            if timing is not None:
                response.raw_headers.append((TIMING, timing))
            return response

        return endpoint

    def authenticate(self, headers: dict[bytes, bytes], caller: InProcessCaller | None = None) -> KeyEntry | None:
        """The caller's key entry; ``None`` for an anonymous request that keys are not required for."""
        if caller is not None:
            return caller.key  # a request made in process (a batch's line) for a caller checked already
        return self.keys.authenticate(_text(headers.get(b"authorization")), self.require_keys)

    async def serve_as(
        self, caller: KeyEntry | None, path: str, body: bytes, request_id: str, admission_class: str = ""
    ) -> Response:
        """Serve one ``POST`` to a ``/v1`` route in process, for ``caller`` instead of an Authorization header.

        The request takes the very path of one from a client (the route's rules, admission, routing,
        budgets, its usage row under ``caller``): only the key check is replaced, by ``caller``'s
        own state now (a revoked or expired key, or a deactivated person's, is refused as on the wire). ``admission_class`` lowers
        the key's class as ``X-Opod-Class`` does (batches run ``sheddable``, behind live traffic).
        """
        if caller is not None:
            refusal = self.keys.refusal(caller)  # the wire's own key check, on the key known by id
            if refusal is not None:
                return error_response(refusal, request_id)
        if self._in_process is None:
            self._in_process = self.endpoints()
        handler = self._in_process.get(("POST", path))
        if handler is None:
            return error_response(UnknownRoute("POST", path, self.known_paths()), request_id)
        raw = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode()),
        ]
        if admission_class:
            raw.append((b"x-opod-class", admission_class.encode()))
        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": raw,
            "http_version": "1.1",
            "scheme": "http",
            "root_path": "",
            "server": ("opod", 0),
            "client": ("in-process", 0),
        }
        return await handler(ReadRequest(scope, body), InProcessCaller(caller))

    async def list_models(self, request: Request) -> Response:
        headers = headers_of(request)
        request_id = sane_request_id(headers.get(b"x-request-id"))
        try:
            self.authenticate(headers)
        except GatewayError as err:
            return error_response(err, request_id)
        now = int(time.time())
        data = [self.model_object(m, now) for m in sorted(self.fleet.served_models()) if not self.canary.hidden(m)]
        data += [{"id": m, "object": "model", "created": now, "owned_by": "peer"} for m in self.overflow.peer_models()]
        return JSONResponse({"object": "list", "data": data}, headers={"X-Request-Id": request_id})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{id}`` (``client.models.retrieve``): a model served here or known to this leader, by its
        name or an alias (answered under the name asked for, as OpenAI answers an alias)."""
        headers = headers_of(request)
        request_id = sane_request_id(headers.get(b"x-request-id"))
        name = request.path_params["model"]
        try:
            self.authenticate(headers)
            if not name:
                raise UnknownRoute(request.method, request.url.path, self.known_paths())
            model = self.known_name(name)
        except GatewayError as err:
            return error_response(err, request_id)
        return JSONResponse(self.model_object(name, int(time.time()), model), headers={"X-Request-Id": request_id})

    def known_name(self, name: str) -> str:
        """The model ``name`` stands for (itself, or the model it is an alias of); :class:`ModelNotFound` otherwise.

        The one rule for a model's name on ``/v1``: a model added to this leader, by its id or one of its
        definition's aliases (``ModelRegistry.named``, as ``/api/v1`` reads names), one a worker serves, or a
        federation peer's (``PEER/MODEL``).
        """
        return self._named(name)[0]

    def _named(self, name: str) -> tuple[str, KnownModel | None]:
        """:meth:`known_name`'s model, and its catalog entry when it has one (a worker's or a peer's has none)."""
        known = self.models.named(name)
        if known is not None:
            return known.id, known
        if self.fleet.serves(name) or self.overflow.is_peer_model(name):
            return name, None
        raise ModelNotFound(name, sorted(self.fleet.served_models() | set(self.models.ids())))

    def model_object(self, name: str, created: int, model: str = "") -> dict[str, str | int]:
        """OpenAI's model object, with ``max_model_len`` (vLLM's name for the context) where it is known."""
        out: dict[str, str | int] = {"id": name, "object": "model", "created": created, "owned_by": "opod"}
        context = self.model_traits.of(model or name).context
        if context is not None:
            out["max_model_len"] = context
        return out

    def known_paths(self) -> list[str]:
        return sorted({path for _, path in self.handlers()} | {"/v1/models/{id}"})

    async def unknown_route(self, request: Request) -> Response:
        """A ``/v1`` path no route answers, or a route asked with a method it does not answer, in OpenAI's error shape."""
        request_id = sane_request_id(headers_of(request).get(b"x-request-id"))
        path, method = request.url.path, request.method
        allowed = sorted(m for m, p in self.handlers() if p == path)
        if not allowed and path.startswith("/v1/models/"):
            allowed = ["GET"]
        error: GatewayError = (
            MethodNotAllowed(method, path, allowed) if allowed else UnknownRoute(method, path, self.known_paths())
        )
        return error_response(error, request_id)

    async def serve(
        self,
        request: Request,
        headers: dict[bytes, bytes],
        spec: RouteSpec,
        exchange: Exchange,
        policy: PolicyView | None,
        caller: InProcessCaller | None,
    ) -> Response:
        key = self.authenticate(headers, caller)
        exchange.identified(key)
        hops = self.overflow.check_hops(headers)
        body = read_whole(request)
        if body is None or len(body) > spec.body_cap:
            body = await read_body(request, spec.body_cap)
        check_content_type(headers.get(b"content-type"))
        payload = json_object(body)
        received = body  # as the client sent it: the body kept for inspection and replay
        model = self.resolve_model(payload, spec)
        self.canary.check_named(model, key)
        peer = self.overflow.peer_target(model)
        if peer is None and self.overflow.is_peer_model(model):
            raise NoCapacity(
                f"The federation peer that serves {model!r} is down or no longer offers it. Retry shortly."
            )
        traits = self.model_traits.of(model)
        changed = spec.check(payload, traits)
        changed = model != payload.get("model") or changed
        dimensions = payload.pop("dimensions", None) if spec.capability == "embedding" else None
        changed = dimensions is not None or changed  # the engine makes whole vectors; the gateway cuts them
        payload["model"] = model
        exchange.parsed(model, payload)
        guard = self.guard_plan(exchange)
        redacted = guard is not None and GuardPolicies.check_request(guard, payload, exchange.guarded())
        changed = redacted or changed
        keep = None
        if self.bodies is not None:
            body_state, keep = self.bodies.plan(exchange.project_id, payload)
            if guard is not None and guard.no_store and keep is not None:
                body_state, keep = NO_STORE, None
            exchange.keeping(body_state)
        stream = payload.get("stream") is True
        strip_usage = assemble = False
        budgeted = exchange.budgeted
        template = self.template_cost(model) if budgeted and "messages" in payload else None
        prompt = prompt_size(payload, None, template)
        if spec.capability == "chat":
            default_max_tokens = self.default_max_tokens()
            if asked_limit(payload) is None:
                limit = default_limit(spec.path, default_max_tokens, traits.context, prompt)
                if limit is not None:
                    payload["max_tokens"] = limit
                    changed = True
            exchange.capped(completion_bound(payload, traits.context, prompt, default_max_tokens))
            if not stream and prompt.prompts > 1:
                # A list of prompts: llama-server's whole answer counts the first prompt only, its stream each one.
                payload["stream"] = assemble = changed = True
                payload["stream_options"] = {"include_usage": True}
            if stream:
                options = payload.get("stream_options")
                if not isinstance(options, dict) or options.get("include_usage") is not True:
                    # Always count tokens; the usage chunk is dropped if the client did not ask for it.
                    payload["stream_options"] = {
                        **(options if isinstance(options, dict) else {}),
                        "include_usage": True,
                    }
                    strip_usage = changed = True
            changed = json_object_as_schema(payload) or changed
        if changed:
            body = fastjson.dumps(payload)  # often: a stream asks for usage, a limit is filled in
            if redacted:
                received = body  # what a guard policy took out is not kept either
        if budgeted:
            await self.reserve(exchange, model, payload, prompt)
        # The mounted policy when it has guardrail webhooks; most have none, and their phases are not looked up.
        hooks = policy if policy is not None and policy.guardrails else None
        if hooks is not None:
            body = await self.guardrails.pre(hooks, exchange.request_id, model, body, exchange.guarded())
        # A whole answer the post guardrails or a guard policy judge is held: its row waits for their verdict.
        judged = (hooks is not None and bool(hooks.guardrails_for("post"))) or (
            guard is not None and bool(guard.outputs)
        )
        hold = not stream and judged
        call = RelayCall(spec.path, body, stream, strip_usage, exchange, assemble)
        if peer is not None:
            exchange.relaying(hold)
            exchange.routed({"peer": peer.peer})
            response = await self.overflow.to_peer(peer, call, payload, exchange, hops)
        else:
            if self.demand is not None and (starting := self.demand(model)) is not None:
                await starting  # nothing serves it yet: the reconciler starts a replica and this request waits for it
            klass = resolve_class(key.admission_class if key is not None else "", _text(headers.get(b"x-opod-class")))
            try:
                await self._admit(model, klass, key, exchange)
                routing = self.routing_policy(policy)
                if self.profiles is not None and key is not None and key.routing_profile:
                    routing = self.profiles.routing(routing, key.routing_profile)
                route, call = self.route_request(model, payload, routing, exchange, call)
                exchange.relaying(hold)
                response = await self.relay.forward(call, route, routing)
            except Stopping:
                raise
            except NoCapacity as refusal:  # every slot taken past the hold, or no worker took it before its first byte
                if not self.overflow.available(model, policy):
                    raise
                exchange.relaying(hold)
                response = await self.overflow.fall_back(call, model, payload, exchange, policy, refusal, hops)
        if dimensions is not None and not stream:
            response = cut_embeddings(response, dimensions)
        if judged or hooks is not None:
            response = await self._after(hooks, guard, exchange, model, body, response, stream)
        if keep is not None and self.bodies is not None:
            response = self.bodies.keep(
                keep,
                request_id=exchange.request_id,
                project_id=exchange.project_id,
                path=spec.path,
                model=model,
                served_model=exchange.served_model,
                request=received,
                response=response,
                stream=stream,
            )
        return response

    def template_cost(self, model: str) -> TemplateCost | None:
        """``model``'s chat template cost when learnt (learning it in the background from a worker holding it)."""
        if self.templates is None:
            return None
        return self.templates.known(model, lambda: next((n.id for n in self.fleet.workers_for(model)), None))

    async def reserve(self, exchange: Exchange, model: str, payload: dict[str, Any], prompt: PromptSize) -> None:
        """Hold the request's most it can cost against its scopes' budgets; :class:`BudgetExceeded` when it would
        pass one.

        A chat is bounded by its text and its model's template cost. Where that cost is not known yet, or
        the bound would be refused, a worker holding the model counts the prompt as its engine will, and
        the count decides, so a request near a budget's end is refused for what it can cost, not for the
        looseness of a bound.
        """
        budgets = self.budgets
        if budgets is None:
            return
        cap = exchange.completion_cap or 0
        micros = budgets.cost(model, prompt.bound(), cap)
        if prompt.messages and (prompt.template is None or not budgets.fits(exchange.scopes, micros)):
            counted = await self.count_prompt(model, payload)
            if counted is not None:
                exchange.counted(counted)
                micros = budgets.cost(model, prompt_size(payload, counted).bound(), cap)
        exchange.reserved(micros)

    async def count_prompt(self, model: str, payload: dict[str, Any]) -> int | None:
        """The chat's prompt tokens, its template applied, as the least busy worker holding ``model`` counts
        them; ``None`` when none can say (the reservation then takes the bound without a count)."""
        workers = self.fleet.workers_for(model)
        if self.prompts is None or not workers:
            return None
        node = min(workers, key=lambda n: n.in_flight)
        return await self.prompts.count_now(node.id, model, payload)

    def routing_policy(self, view: PolicyView | None) -> RoutingPolicy:
        """The router's settings for the mounted policy's view, made once per view."""
        made_for, routing = self._routing
        if view is not made_for:
            routing = routing_policy(view)
            self._routing = (view, routing)
        return routing

    def route_request(
        self, model: str, payload: dict[str, Any], routing: RoutingPolicy, exchange: Exchange, call: RelayCall
    ) -> tuple[RouteRequest, RelayCall]:
        """What the router needs to know about this request: its canary group, its prefix, its pin; and the call,
        naming the candidate when the request was drawn to it."""
        route, call = self.canary.route(model, routing, exchange, call, payload)
        # A prompt too short to place by its prefix (most chats) is neither hashed nor pinned: asked once here.
        if (routing.prefix_block_weight or routing.prefix_affinity) and worth_placing(payload):
            if routing.prefix_block_weight:
                route.hashes = self.prefix.hashes(route.model, payload)
            if routing.prefix_affinity:
                route.payload = payload
        return route, call

    async def _admit(self, model: str, klass: AdmissionClass, key: KeyEntry | None, exchange: Exchange) -> None:
        """An engine slot of ``model``'s pool for the request's class, waiting for one if need be; ``Shed`` if none."""
        permit = self.admission.admit_now(model, klass)
        if permit is None:
            waited = time.perf_counter()
            permit = await self.admission.wait(
                model, klass, team=key.team if key is not None else "", key_id=exchange.key_id
            )
            exchange.admitted(permit, str(klass), int((time.perf_counter() - waited) * 1000))
        else:
            exchange.admitted(permit, str(klass))

    def guard_plan(self, exchange: Exchange) -> GuardPlan | None:
        """The guard policies' checks that apply to the request's caller, ``None`` when none do."""
        if self.guard is None:
            return None
        return self.guard.plan(
            org=exchange.org_id,
            team=exchange.team_id,
            project=exchange.project_id,
            user=exchange.user_id,
            key=exchange.key_id,
        )

    async def _after(
        self,
        hooks: PolicyView | None,
        guard: GuardPlan | None,
        exchange: Exchange,
        model: str,
        body: bytes,
        response: Response,
        stream: bool,
    ) -> Response:
        """The guard policies' output checks, then the policy file's post and logging-only webhooks (``hooks``: the
        policy when it has any); a streamed answer is only logged (it is already on its way)."""
        answer = None if stream else bytes(response.body)
        if answer is not None and response.status_code == 200:
            checked = answer
            if guard is not None and guard.outputs:
                parsed = response.parsed if isinstance(response, RelayedAnswer) else None
                checked = GuardPolicies.check_answer(guard, checked, exchange.guarded(), parsed)
            if hooks is not None and hooks.guardrails_for("post"):
                checked = await self.guardrails.post(hooks, exchange.request_id, model, body, checked, exchange.guard)
            if checked is not answer:
                response = Response(
                    checked, status_code=200, media_type="application/json", headers=dict(response.headers)
                )
                response.headers["content-length"] = str(len(checked))
                answer = checked
        exchange.let_through()
        if hooks is not None and hooks.guardrails_for("logging_only"):
            self.guardrails.log(hooks, exchange.request_id, model, body, answer=answer, status=response.status_code)
        return response

    def resolve_model(self, payload: dict[str, Any], spec: RouteSpec) -> str:
        """The model a request names; ``"auto"`` is the plan's model, else the first wanted one that does the route's work."""
        model = require_model(payload)
        plan = self.policies.current_plan()
        if model == "auto":
            model = (plan.model if plan is not None else "") or self.models.default_for(spec.capability) or ""
            if not model:
                raise BadRequest(
                    f"model 'auto' means the default model, and none is loaded for {spec.path}; "
                    "name one (GET /v1/models lists them).",
                    param="model",
                )
        if plan is not None and plan.model and model != plan.model and not _is_plan_adapter(model, plan):
            known = self.models.named(model)  # an alias of the plan's model names it too
            if known is None or known.id != plan.model:
                raise ModelNotFound(model, [plan.model])
        model, known = self._named(model)
        if known is not None and spec.capability not in known.capabilities:
            code, what = UNSUPPORTED[spec.capability]
            raise NotSupported(f"The model {model!r} {what}.", code)
        return model


def _is_plan_adapter(model: str, plan: PlanSnapshot) -> bool:
    base, _, adapter = model.partition(":")
    return base == plan.model and adapter in (plan.adapters or [])
