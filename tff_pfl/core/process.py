"""The personalized process: an iterative process with client state.

TFF's `LearningProcess` has `next(state@SERVER, data@CLIENTS)` and no
per-client state. Every method in the papers keeps something on each client
between rounds (a personal model, a head, a discriminator, stored
predictions, a control variate), so a `PersonalizedProcess` has

    initialize: ( -> ServerState@SERVER)
    next:       (<ServerState@SERVER, C@CLIENTS, {D*}@CLIENTS>
                 -> <server_state=ServerState@SERVER, client_states=C@CLIENTS,
                     metrics=M@SERVER>)
    evaluate:   Python function (server_state, client_states, client_data)
                 -> <personal=E@CLIENTS[, global=E@CLIENTS]>

`evaluate` passes only `server_state.global_model_weights` into TFF, never
the rest of the server state, over the computation

    (<ModelWeights@SERVER, C@CLIENTS, {D*}@CLIENTS>
     -> <personal=E@CLIENTS[, global=E@CLIENTS]>)

or, for a method whose personalized model is the global model (FedAvg,
SCAFFOLD, FedCurv, ...), `(<ModelWeights@SERVER, {D*}@CLIENTS> ->
<global=E@CLIENTS>)`, which ignores the client states:
`evaluate_reads_client_states` is False and the driver does not load them.
Passing FedCurv's two model-sized tensors a client into TFF cost ~4 s a
client with 9M parameters, 100 s of a 25-client chunk against 1 s without
them;

and, for methods whose clients train one model of the spec (every method
here but AFedCL), two computations for FedPSD's Eq. 10 metric (each sampled
client's model after local training, before aggregation):

    next_with_local_models: like `next`, returning also
                 local_models=ModelWeights@CLIENTS
    evaluate_models: (<ModelWeights@CLIENTS, {D*}@CLIENTS> -> E@CLIENTS)

plus `evaluate_weights(weights, dataset)`, the same statistics computed
eagerly in Python, for a centralized test set (TFF serializes a dataset
given to a computation with its data, limited to 100 MB).

and the Python driver (`tff_pfl.core.loop`) keeps the client states in a
store between rounds. `next` is composed like `tff.learning.templates.
compose_learning_process`, from swappable pieces:

1. distribution: a `tff.learning.templates.DistributionProcess` that sends
   `Broadcast(model_weights, round_num, extra)` to the clients, where
   `extra` is what the method's finalizer state exposes to clients through
   `broadcast_extra` (SCAFFOLD's server control variate, FedCurv's Fisher
   sums; `()` for most methods);
2. client work: a `ClientWork` whose `update` computation maps
   `(Broadcast, C, {D*}) -> ClientOutput(update, update_weight,
   client_state, metrics, local_model)`;
3. aggregation: a `tff.aggregators` weighted factory over `update`
   (omitted for methods without a global model, e.g. No-FL);
4. finalization: a `tff.learning.templates.FinalizerProcess` that turns the
   aggregate into the new global weights.

Because `next` returns CLIENTS-placed values it cannot run under
`tff.program`'s native context, `run_training_process` or MapReduce form
(field guide section 2): it is a simulation process driven by our own loop.
"""

import collections
from collections.abc import Callable
import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.templates import evaluation

ModelWeights = tff.learning.models.ModelWeights


class ServerState(NamedTuple):
  """Server state of every personalized process."""
  global_model_weights: Any
  distributor: Any
  aggregator: Any
  finalizer: Any
  round_num: Any


class Broadcast(NamedTuple):
  """What the server sends to each sampled client.

  Attributes:
    model_weights: the global `ModelWeights`.
    round_num: the 0-based round number (int32).
    extra: server values besides the model that the method's clients need,
      read off the finalizer state by `broadcast_extra` (see
      `compose_personalized_process`); `()` when there are none.
  """
  model_weights: Any
  round_num: Any
  extra: Any = ()


def broadcast_type(weights_type: tff.Type,
                   extra_type: Any = ()) -> tff.Type:
  """The TFF type of `Broadcast` for a model's weights type."""
  return tff.types.tensorflow_to_type(Broadcast(
      model_weights=weights_type, round_num=tff.TensorType(np.int32),
      extra=extra_type))


class ClientOutput(NamedTuple):
  """What a client's update computation returns.

  Attributes:
    update: the value aggregated at the server (ignored without aggregation).
    update_weight: its float32 aggregation weight (0 drops the client).
    client_state: the client's new state, kept in the store. A client
      whose training diverged returns its state unchanged, participation
      count included: methods read `num_participations > 0` as "has its own
      trained state", so a diverged first participation must not count.
    metrics: `OrderedDict` of float32 sums, summed over clients.
    local_model: the client's `ModelWeights` (of the spec's Keras model)
      after local training, before aggregation (what FedPSD's Eq. 10
      evaluates); `()` when the method's client trains something else. A
      client whose training diverged reports the model it falls back to
      (the weights it started from), so Eq. 10 still counts it.
  """
  update: Any
  update_weight: Any
  client_state: Any
  metrics: Any
  local_model: Any = ()


class RoundOutput(NamedTuple):
  server_state: Any
  client_states: Any
  metrics: Any


class RoundOutputWithLocalModels(NamedTuple):
  server_state: Any
  client_states: Any
  metrics: Any
  local_models: Any


@dataclasses.dataclass(frozen=True)
class ClientWork:
  """An algorithm's client side.

  Attributes:
    update: `tff.tensorflow.computation` of type
      `(<Broadcast, C, {D*}> -> ClientOutput)`.
    state_type: the TFF type `C` of the client state.
    initial_state: `client_id -> C` as NumPy values, used the first time a
      client is seen.
    personal_weights: TensorFlow function `(global ModelWeights, C) ->
      ModelWeights` giving the client's personalized model; `None` when the
      personalized model is the global model (FedAvg, FedProx).
    personal_eval: for personalized models that are not one Keras model of
      the spec (e.g. AFedCL's fusion of two encoders): a function
      `(global ModelWeights, C, dataset) -> evaluation statistics`, called
      inside a `tff.tensorflow.computation` body, so it may build Keras
      models (see `templates.evaluation`). Takes precedence over
      `personal_weights`.
    global_model_evaluable: False when the global weights are not a usable
      classifier on their own (e.g. FedPer's global head is never trained),
      so that no "global" metrics are reported.
    personal_features: for methods with `personal_eval`, an eager function
      `(global ModelWeights, C, x) -> features` giving the representation
      the personalized classifier sees (e.g. AFedCL's fused features); by
      default the encoder output of the personalized model.
  """
  update: tff.Computation
  state_type: tff.Type
  initial_state: Callable[[str], Any]
  personal_weights: Optional[Callable[[Any, Any], Any]] = None
  personal_eval: Optional[Callable[[Any, Any, Any], Any]] = None
  global_model_evaluable: bool = True
  personal_features: Optional[Callable[[Any, Any, Any], Any]] = None


@dataclasses.dataclass(frozen=True)
class PersonalizedProcess:
  """A compiled personalized process and what the driver needs to run it."""
  initialize: tff.Computation
  next: tff.Computation
  evaluate: Callable[[Any, Any, Any], Any]
  initial_client_state: Callable[[str], Any]
  has_global_model: bool
  name: str = ''
  personal_features: Optional[Callable[[Any, Any, Any], Any]] = None
  local_models_fns: Optional[Callable[[], tuple[Any, Any]]] = None
  evaluate_weights: Optional[Callable[[Any, Any], Any]] = None
  # False: `evaluate` ignores its client states (pass None).
  evaluate_reads_client_states: bool = True

  @property
  def has_local_models(self) -> bool:
    return self.local_models_fns is not None

  @property
  def next_with_local_models(self) -> Optional[tff.Computation]:
    """`next` also returning the local models (built on first use)."""
    return self.local_models_fns()[0] if self.has_local_models else None

  @property
  def evaluate_models(self) -> Optional[tff.Computation]:
    """Evaluation of weights@CLIENTS on data@CLIENTS (built on first use)."""
    return self.local_models_fns()[1] if self.has_local_models else None

  def get_model_weights(self, server_state: ServerState) -> Any:
    return server_state.global_model_weights


def _weights_evaluator(spec: model_spec_lib.ModelSpec):
  """`tf.function (model, ModelWeights, dataset) -> statistics`."""

  @tf.function
  def evaluate_weights(model, weights, dataset):
    model_spec_lib.assign_weights(model, weights)
    return evaluation.evaluate_model(spec, model, dataset)

  return evaluate_weights


def _eager_evaluator(spec: model_spec_lib.ModelSpec):
  """`(ModelWeights, dataset) -> statistics`, eager, one Keras model."""
  evaluate_weights = _weights_evaluator(spec)

  @functools.cache
  def model():
    return spec.keras_model_fn()

  def evaluate(weights, dataset):
    stats = evaluate_weights(model(), _as_model_weights(weights), dataset)
    return tf.nest.map_structure(lambda t: t.numpy(), stats)

  return evaluate


def _default_personal_features(spec: model_spec_lib.ModelSpec,
                               personal_fn: Optional[Callable[..., Any]]):
  """Encoder output of the personalized model (eager, for figures)."""

  def features(global_weights, client_state, x):
    weights = _as_model_weights(global_weights)
    if personal_fn is not None:
      weights = _as_model_weights(personal_fn(weights, client_state))
    model = spec.keras_model_fn()
    model_spec_lib.assign_weights(model, weights)
    try:
      encoder = model.get_layer('encoder')
    except ValueError as e:
      raise ValueError('personal features need a model with an \'encoder\' '
                       'sub-model (keras_models.build_model).') from e
    return encoder(x, training=False)

  return features


def _as_model_weights(value: Any) -> ModelWeights:
  return ModelWeights(trainable=list(value.trainable),
                      non_trainable=list(value.non_trainable))


def compose_personalized_process(
    spec: model_spec_lib.ModelSpec,
    initial_weights: ModelWeights,
    client_work: ClientWork,
    *,
    aggregator_factory: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    finalizer: Optional[tff.learning.templates.FinalizerProcess] = None,
    distributor: Optional[tff.learning.templates.DistributionProcess] = None,
    broadcast_extra: Optional[tff.Computation] = None,
    name: str = '',
) -> PersonalizedProcess:
  """Composes a `PersonalizedProcess` from its pieces.

  Args:
    spec: the model spec (types and the Keras builder for evaluation).
    initial_weights: seeded initial global weights (NumPy `ModelWeights`).
    client_work: the algorithm's client side.
    aggregator_factory: weighted factory for `ClientOutput.update`; `None`
      means the method has no global model (the global weights never change
      and `finalizer` must be `None` too).
    finalizer: turns the aggregate into new global weights; required when
      `aggregator_factory` is given.
    distributor: broadcasts `Broadcast`; default plain broadcast.
    broadcast_extra: optional `tff.tensorflow.computation` mapping the
      finalizer's state to `Broadcast.extra` (server-side values the clients
      need, e.g. SCAFFOLD's control variate kept in its finalizer state);
      default `()`.
    name: the algorithm's name, for reports.

  Returns:
    A `PersonalizedProcess`.
  """
  if (aggregator_factory is None) != (finalizer is None):
    raise ValueError('aggregator_factory and finalizer go together: give '
                     'both (a method with a global model) or neither.')
  if broadcast_extra is not None and finalizer is None:
    raise ValueError('broadcast_extra reads the finalizer state: it needs a '
                     'finalizer.')
  weights_type = spec.weights_type()
  data_type = spec.data_type()
  state_type = client_work.state_type
  if finalizer is not None:
    finalizer_state_type = finalizer.initialize.type_signature.result.member
  if broadcast_extra is not None:
    tff.test.assert_type_assignable_from(
        broadcast_extra.type_signature.parameter, finalizer_state_type)
    extra_type = broadcast_extra.type_signature.result
  else:
    extra_type = tff.StructType([])
  full_broadcast_type = broadcast_type(weights_type, extra_type)
  if distributor is None:
    distributor = tff.learning.templates.build_broadcast_process(
        full_broadcast_type)

  update_sig = client_work.update.type_signature
  output_type = update_sig.result
  tff.test.assert_type_assignable_from(update_sig.parameter[0],
                                      full_broadcast_type)
  tff.test.assert_type_assignable_from(update_sig.parameter[1], state_type)

  if aggregator_factory is not None:
    aggregator = aggregator_factory.create(
        output_type.update, output_type.update_weight)
    if not aggregator.is_weighted:
      raise TypeError('the aggregator must be weighted.')
  else:
    aggregator = None

  frozen = initial_weights

  @tff.tensorflow.computation
  def initial_weights_fn():
    return tf.nest.map_structure(tf.constant, frozen)

  @tff.federated_computation
  def initialize_fn():
    empty = tff.federated_value((), tff.SERVER)
    return tff.federated_zip(ServerState(
        global_model_weights=tff.federated_eval(initial_weights_fn,
                                                tff.SERVER),
        distributor=distributor.initialize(),
        aggregator=(aggregator.initialize() if aggregator else empty),
        finalizer=(finalizer.initialize() if finalizer else empty),
        round_num=tff.federated_value(np.int32(0), tff.SERVER)))

  server_state_type = initialize_fn.type_signature.result
  clients_state_type = tff.FederatedType(state_type, tff.CLIENTS)
  clients_data_type = tff.FederatedType(data_type, tff.CLIENTS)

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  metrics_type = output_type.metrics

  def round_body(server_state, client_states, client_data):
    if broadcast_extra is not None:
      extra = tff.federated_map(broadcast_extra, server_state.finalizer)
    else:
      extra = tff.federated_value((), tff.SERVER)
    broadcast_value = tff.federated_zip(Broadcast(
        model_weights=server_state.global_model_weights,
        round_num=server_state.round_num, extra=extra))
    dist = distributor.next(server_state.distributor, broadcast_value)
    outputs = tff.federated_map(client_work.update,
                                (dist.result, client_states, client_data))
    metrics = collections.OrderedDict(
        client_work=tff.federated_sum(outputs.metrics))
    if aggregator is not None:
      agg = aggregator.next(server_state.aggregator, outputs.update,
                            outputs.update_weight)
      fin = finalizer.next(server_state.finalizer,
                           server_state.global_model_weights, agg.result)
      new_weights, agg_state, fin_state = fin.result, agg.state, fin.state
      metrics['aggregator'] = agg.measurements
      metrics['finalizer'] = fin.measurements
    else:
      new_weights = server_state.global_model_weights
      agg_state, fin_state = server_state.aggregator, server_state.finalizer
    new_state = tff.federated_zip(ServerState(
        global_model_weights=new_weights,
        distributor=dist.state,
        aggregator=agg_state,
        finalizer=fin_state,
        round_num=tff.federated_map(increment, server_state.round_num)))
    return new_state, outputs, tff.federated_zip(metrics)

  @tff.federated_computation(server_state_type, clients_state_type,
                             clients_data_type)
  def next_fn(server_state, client_states, client_data):
    new_state, outputs, metrics = round_body(server_state, client_states,
                                             client_data)
    return RoundOutput(new_state, outputs.client_state, metrics)

  del metrics_type
  has_global = aggregator is not None and client_work.global_model_evaluable
  evaluate_fn, eval_weights, reads_states = _build_evaluate(
      spec, weights_type, data_type, state_type, client_work,
      has_global=has_global)

  # Traced on first use only: most runs never evaluate local models, and
  # tracing two more computations costs every process build ~2 s.
  local_models_fns = None
  if _has_local_model(output_type.local_model, weights_type):

    @functools.cache
    def local_models_fns():

      @tff.federated_computation(server_state_type, clients_state_type,
                                 clients_data_type)
      def next_with_local_models(server_state, client_states, client_data):
        new_state, outputs, metrics = round_body(server_state, client_states,
                                                 client_data)
        return RoundOutputWithLocalModels(new_state, outputs.client_state,
                                          metrics, outputs.local_model)

      @tff.federated_computation(
          tff.FederatedType(weights_type, tff.CLIENTS), clients_data_type)
      def evaluate_models(local_models, datasets):
        return tff.federated_map(eval_weights, (local_models, datasets))

      return next_with_local_models, evaluate_models
  if client_work.personal_eval is not None:
    features_fn = client_work.personal_features
  else:
    features_fn = _default_personal_features(spec,
                                             client_work.personal_weights)
  return PersonalizedProcess(
      initialize=initialize_fn, next=next_fn, evaluate=evaluate_fn,
      initial_client_state=client_work.initial_state,
      has_global_model=has_global, name=name,
      personal_features=features_fn,
      local_models_fns=local_models_fns,
      evaluate_weights=_eager_evaluator(spec),
      evaluate_reads_client_states=reads_states)


def _has_local_model(local_model_type: tff.Type,
                     weights_type: tff.Type) -> bool:
  """Whether a client work's `local_model` output is a spec model."""
  if isinstance(local_model_type, tff.StructType) and not local_model_type:
    return False
  try:
    tff.test.assert_type_assignable_from(weights_type, local_model_type)
  except (AssertionError, TypeError) as e:
    raise TypeError(
        'ClientOutput.local_model must be the model weights after local '
        f'training (type {weights_type}) or (); got {local_model_type}.'
    ) from e
  return True


def _build_evaluate(spec, weights_type, data_type, state_type, client_work,
                    *, has_global):
  """Evaluation of every given client's personal (and global) model.

  Returns `(evaluate, eval_global, reads_client_states)`.
  """
  evaluate_weights = _weights_evaluator(spec)

  @tff.tensorflow.computation(weights_type, data_type)
  def eval_global(weights, dataset):
    model = spec.keras_model_fn()
    return evaluate_weights(model, _as_model_weights(weights), dataset)

  personal_fn = client_work.personal_weights

  def eval_personal(weights, client_state, dataset):
    model = spec.keras_model_fn()
    personal = personal_fn(_as_model_weights(weights), client_state)
    return evaluate_weights(model, _as_model_weights(personal), dataset)

  if client_work.personal_eval is not None:
    def eval_custom(weights, client_state, dataset):
      return client_work.personal_eval(_as_model_weights(weights),
                                       client_state, dataset)
    eval_personal = tff.tensorflow.computation(
        eval_custom, weights_type, state_type, data_type)
  elif personal_fn is not None:
    eval_personal = tff.tensorflow.computation(
        eval_personal, weights_type, state_type, data_type)
  has_personal = (client_work.personal_eval is not None
                  or personal_fn is not None)
  if not has_personal and not has_global:
    raise ValueError('a method without a usable global model must define '
                     'its personalized model (personal_weights or '
                     'personal_eval).')

  # Only the global weights go into TFF, never the rest of the server state
  # (FedCurv's and SCAFFOLD's extras are model-sized), and client states
  # only when the personalized model is built from them: serializing
  # FedCurv's per-client Fisher terms dominated evaluation.
  global_weights_type = tff.FederatedType(weights_type, tff.SERVER)
  clients_data_type = tff.FederatedType(data_type, tff.CLIENTS)
  if has_personal:

    @tff.federated_computation(global_weights_type,
                               tff.FederatedType(state_type, tff.CLIENTS),
                               clients_data_type)
    def evaluate_personal(global_weights, client_states, client_data):
      weights = tff.federated_broadcast(global_weights)
      out = collections.OrderedDict()
      out['personal'] = tff.federated_map(
          eval_personal, (weights, client_states, client_data))
      if has_global:
        out['global'] = tff.federated_map(eval_global, (weights, client_data))
      return out

    def evaluate_fn(server_state, client_states, client_data):
      return evaluate_personal(server_state.global_model_weights,
                               client_states, client_data)

    return evaluate_fn, eval_global, True

  @tff.federated_computation(global_weights_type, clients_data_type)
  def evaluate_global(global_weights, client_data):
    weights = tff.federated_broadcast(global_weights)
    return collections.OrderedDict(
        [('global', tff.federated_map(eval_global, (weights, client_data)))])

  def evaluate_fn(server_state, client_states, client_data):
    del client_states  # the personalized model is the global model
    return evaluate_global(server_state.global_model_weights, client_data)

  return evaluate_fn, eval_global, False


def compose_with_global_model(
    spec: model_spec_lib.ModelSpec,
    initial_weights: ModelWeights,
    client_work: ClientWork,
    *,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    aggregator_factory: Optional[
        tff.aggregators.WeightedAggregationFactory] = None,
    finalizer: Optional[tff.learning.templates.FinalizerProcess] = None,
    broadcast_extra: Optional[tff.Computation] = None,
    name: str = '',
) -> PersonalizedProcess:
  """Composes a delta-uploading method with FedAvg's server side.

  The server averages `ClientOutput.update` (a `ModelWeights`-shaped
  pseudo-gradient plus BN statistics) with `aggregator_factory` (default
  example-weighted `MeanFactory`) and applies it with `server_optimizer`
  (default SGD at learning rate 1, i.e. plain averaging) through
  `finalizers.build_optimizer_and_average_finalizer`. Methods whose upload
  or server step differ (SCAFFOLD, FedNova, FedCurv) pass their own
  `finalizer` (then `server_optimizer` must be None: it is the finalizer's)
  and, when clients need server values, `broadcast_extra`.
  """
  from tff_pfl.templates import finalizers  # pylint: disable=g-import-not-at-top
  if finalizer is not None and server_optimizer is not None:
    raise ValueError('give server_optimizer to the custom finalizer, not '
                     'to compose_with_global_model.')
  if finalizer is None:
    if server_optimizer is None:
      server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
    finalizer = finalizers.build_optimizer_and_average_finalizer(
        server_optimizer, spec.weights_type())
  return compose_personalized_process(
      spec, initial_weights, client_work,
      aggregator_factory=aggregator_factory or tff.aggregators.MeanFactory(),
      finalizer=finalizer, broadcast_extra=broadcast_extra, name=name)
