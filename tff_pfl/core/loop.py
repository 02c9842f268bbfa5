"""The one round loop every algorithm runs.

Per round r = 1..R:
  1. cohort = sampler.sample(r) (seeded, fixed in advance);
  2. the cohort's client states come from the store (initial on first use);
  3. each client's training dataset is shuffled/augmented with a seed derived
     from (seed, r, client), because seeds inside TFF computations replay
     every round;
  4. `process.next` runs the round (`process.next_with_local_models` on
     evaluation rounds with `local_eval`); new client states go back to the
     store;
  5. every `eval_every` rounds and after the last one, ALL clients are
     evaluated on their own test (and validation, if any) split: the
     personalized model and, where the method has one, the global model;
     with `local_eval`, also the round's sampled clients' models after local
     training, before aggregation (FedPSD's Eq. 10), on their own test
     split (`local/...`) and on the pooled test set (`local_pooled/...`).

The loop keeps the per-round and per-client history and tracks the last
round, the best round on validation (when a validation split exists) and the
best round on test, each named as such in the result.

Every round's row is released through `tff.program` release managers (e.g.
`CSVFileReleaseManager`, `TensorBoardReleaseManager`), driven on the loop's
own event loop (`asyncio.run` would break TFF's sync context on Python 3.11,
field guide pitfall 16). With a `CheckpointManager`, the run saves server
state, every client's state and its history every `checkpoint_every` rounds
and, when started again, resumes after the newest checkpoint; the sampling
stream and data seeds depend only on (seed, round), so a resumed run
computes exactly what an unstopped run computes. A run resumed to more
rounds than it first had (where the method allows it) keeps the
evaluation the shorter run made after its last round, which an unstopped
longer run may not make; its best rounds can name that round.
"""

import asyncio
import collections
from collections.abc import Callable, Sequence
import dataclasses
import hashlib
import math
import time
from typing import Any, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from tff_pfl.core import checkpoint as checkpoint_lib
from tff_pfl.core import client_state
from tff_pfl.core import metrics as metrics_lib
from tff_pfl.core import process as process_lib
from tff_pfl.core import sampling

# (client_id, round_num, split) -> batched tf.data.Dataset
DatasetFn = Callable[[str, int, str], tf.data.Dataset]


def derive_seed(*parts: Any) -> int:
  """A 31-bit seed derived deterministically from `parts` (stable hash)."""
  text = '/'.join(str(p) for p in parts).encode()
  return int.from_bytes(hashlib.sha256(text).digest()[:4], 'little') >> 1


class NonFiniteError(FloatingPointError):
  """Every client of a round produced a non-finite loss or model."""


@dataclasses.dataclass
class RunResult:
  """What a run produced.

  Attributes:
    rounds: one dict per round (train metrics, and eval summaries on
      evaluation rounds).
    clients: one dict per client per evaluation.
    final: summaries at the last round.
    best_val: summaries at the round with the best validation score (None
      without a validation split).
    best_test: summaries at the round with the best test score.
    seconds_per_round: mean training wall time per round, excluding the
      first round and the first round after a resumption (tracing and
      worker start-up).
    server_state: the final server state.
    store: the client-state store, holding every client's final state.
    process: the process that ran (e.g. for `personal_features`).
    architecture: `ModelSpec.architecture()` of the model that ran ('' when
      not given).
  """
  rounds: list[dict[str, Any]]
  clients: list[dict[str, Any]]
  final: dict[str, Any]
  best_val: Optional[dict[str, Any]]
  best_test: dict[str, Any]
  seconds_per_round: float
  first_round_seconds: float
  server_state: Any
  store: Any = None
  process: Any = None
  architecture: str = ''


async def _release(managers: Sequence[Any], row: dict[str, Any],
                   key: int) -> None:
  await asyncio.gather(*[m.release(dict(row), key=key) for m in managers])


def _selection_metric(process: process_lib.PersonalizedProcess,
                      summary: dict[str, float]) -> Optional[float]:
  for key in ('personal/accuracy_mean', 'personal/mae_mean'):
    if key in summary:
      value = summary[key]
      return value if key.endswith('accuracy_mean') else -value
  return None


def evaluate_all(process: process_lib.PersonalizedProcess, server_state: Any,
                 store: client_state.ClientStateStore,
                 client_ids: Sequence[str], dataset_fn: DatasetFn,
                 split: str, round_num: int, chunk_size: int = 25,
                 ) -> tuple[dict[str, float], list[dict[str, Any]]]:
  """Evaluates every client; returns summaries and per-client rows.

  Clients are evaluated `chunk_size` at a time, so that with a disk store
  only that many client states are in memory at once. A process whose
  evaluation does not read client states (personalized model = global
  model) is not given them.
  """
  client_ids = list(client_ids)
  stats = collections.OrderedDict()
  for start in range(0, len(client_ids), chunk_size):
    chunk = client_ids[start:start + chunk_size]
    states = (store.get_many(chunk)
              if process.evaluate_reads_client_states else None)
    out = process.evaluate(server_state, states,
                           [dataset_fn(c, round_num, split) for c in chunk])
    for kind, values in out.items():
      stats.setdefault(kind, []).extend(values)
  if 'personal' not in stats:            # personalized model = global model
    stats = collections.OrderedDict(personal=stats['global'], **stats)
  summary = collections.OrderedDict()
  rows = []
  per_kind = {}
  for kind, per_client in stats.items():
    per_kind[kind] = [metrics_lib.client_metrics(s) for s in per_client]
    for name, value in metrics_lib.summarize(per_kind[kind]).items():
      summary[f'{kind}/{name}'] = value
  for i, cid in enumerate(client_ids):
    row = collections.OrderedDict(round=round_num, split=split, client=cid)
    for kind, values in per_kind.items():
      for name, value in values[i].items():
        row[f'{kind}/{name}'] = value
    rows.append(row)
  return summary, rows


def evaluate_local_models(
    process: process_lib.PersonalizedProcess, local_models: Sequence[Any],
    cohort: Sequence[str], dataset_fn: DatasetFn, round_num: int,
    pooled_test: Optional[tf.data.Dataset] = None) -> dict[str, float]:
  """Summaries of the cohort's local models (FedPSD Eq. 10).

  `local/<metric>` evaluates each sampled client's model after local
  training on the client's own test split; `local_pooled/<metric>` on
  `pooled_test` (every client's test split together), when given.
  """
  local_models = list(local_models)
  runs = [('local', process.evaluate_models(
      local_models, [dataset_fn(c, round_num, 'test') for c in cohort]))]
  if pooled_test is not None:    # centralized: evaluated eagerly
    runs.append(('local_pooled', [process.evaluate_weights(w, pooled_test)
                                  for w in local_models]))
  summary = collections.OrderedDict()
  for kind, stats in runs:
    values = [metrics_lib.client_metrics(s) for s in stats]
    for name, value in metrics_lib.summarize(values).items():
      summary[f'{kind}/{name}'] = value
  return summary


def run(
    process: process_lib.PersonalizedProcess,
    *,
    client_ids: Sequence[str],
    dataset_fn: DatasetFn,
    sampler: sampling.ParticipationStream,
    rounds: int,
    store: client_state.ClientStateStore,
    eval_every: int = 1,
    has_val: bool = False,
    progress: Optional[Callable[[int, dict[str, Any]], None]] = None,
    release_managers: Sequence[Any] = (),
    checkpoints: Optional[checkpoint_lib.CheckpointManager] = None,
    checkpoint_every: int = 1,
    fingerprint: str = '',
    architecture: str = '',
    local_eval: bool = False,
    pooled_test: Optional[tf.data.Dataset] = None,
) -> RunResult:
  """Runs `rounds` rounds of `process`; see the module docstring.

  Args:
    process: the algorithm.
    client_ids: every registered client (all are evaluated).
    dataset_fn: builds a client's batched dataset for a round and split
      ('train', 'val' or 'test').
    sampler: the participation stream.
    rounds: number of rounds, >= 1.
    store: the client-state store.
    eval_every: evaluate every this many rounds (and after the last).
    has_val: whether clients have a validation split.
    progress: called after each round with (round, that round's row).
    release_managers: `tff.program.ReleaseManager`s; each round's row is
      released with key = round.
    checkpoints: where to checkpoint and resume from (None: no checkpoints).
    checkpoint_every: checkpoint every this many rounds (and after the last).
    fingerprint: identifies the run's configuration; resuming from a
      checkpoint written with another fingerprint is an error.
    architecture: `ModelSpec.architecture()` of the process's model;
      resuming from a checkpoint written with another one is an error (the
      configuration can be equal while the code builds another model, e.g.
      a changed default). A checkpoint that recorded none ('' or written
      before this check existed) resumes with a warning.
    local_eval: on evaluation rounds, also evaluate the sampled clients'
      models after local training (see `evaluate_local_models`); needs a
      method whose client work reports `ClientOutput.local_model`.
    pooled_test: the pooled test set for `local_eval`.

  Raises:
    NonFiniteError: when every sampled client of a round diverged.
  """
  if rounds < 1:
    raise ValueError(f'rounds must be >= 1, got {rounds}.')
  if eval_every < 1:
    raise ValueError(f'eval_every must be >= 1, got {eval_every}.')
  if checkpoint_every < 1:
    raise ValueError(f'checkpoint_every must be >= 1, got {checkpoint_every}.')
  if local_eval and not process.has_local_models:
    raise ValueError(
        f'local_eval: {process.name or "this method"} does not report its '
        'clients\' models after local training (ClientOutput.local_model).')
  server_state = process.initialize()
  history, client_rows, times = [], [], []
  best_val = best_test = None
  best_val_score = best_test_score = -math.inf
  final = {}
  start_round = 1
  if checkpoints is not None:
    restored = checkpoints.restore_latest(server_state, store)
    if restored is not None:
      ls = restored.loop_state
      if ls.get('fingerprint', '') != fingerprint:
        raise ValueError(
            'the checkpoint was written by a run with a different '
            f'configuration ({ls.get("fingerprint")!r} vs {fingerprint!r}); '
            'use another output folder, or start afresh (programs.run '
            '--noresume; elsewhere remove the checkpoints).')
      written_with = ls.get('architecture') or ''
      if not written_with:
        logging.warning(
            'the checkpoint at round %d records no model architecture; '
            'resuming without checking that the model is built as it was.',
            restored.round_num)
      elif architecture and written_with != architecture:
        raise ValueError(
            'the checkpoint was written with a model built differently '
            f'(layer settings or weight shapes; architecture {written_with!r} '
            f'vs {architecture!r}), e.g. by an older version of the code; '
            'use another output folder, or start afresh (programs.run '
            '--noresume; elsewhere remove the checkpoints).')
      server_state = restored.server_state
      history, client_rows, times = ls['history'], ls['clients'], ls['times']
      best_val, best_test, final = ls['best_val'], ls['best_test'], ls['final']
      best_val_score, best_test_score = ls['best_val_score'], ls[
          'best_test_score']
      start_round = restored.round_num + 1
  warm_up = {0, len(times)}   # indices in `times` of rounds that traced
  event_loop = asyncio.new_event_loop()
  for r in range(start_round, rounds + 1):
    cohort = sampler.sample(r)
    states = store.get_many(cohort)
    datasets = [dataset_fn(c, r, 'train') for c in cohort]
    eval_round = r % eval_every == 0 or r == rounds
    start = time.perf_counter()
    if local_eval and eval_round:
      server_state, new_states, round_metrics, local_models = (
          process.next_with_local_models(server_state, states, datasets))
    else:
      server_state, new_states, round_metrics = process.next(
          server_state, states, datasets)
    times.append(time.perf_counter() - start)
    cw = round_metrics['client_work']
    n_bad = int(round(float(cw['non_finite'])))
    if n_bad == len(cohort):
      raise NonFiniteError(
          f'round {r}: training produced a non-finite loss or model on all '
          f'{len(cohort)} sampled clients ({process.name}); lower the '
          'learning rate. Client states and the global model were not '
          'updated with the diverged values.')
    store.put_many(cohort, list(new_states))
    row = collections.OrderedDict(
        round=r, clients=len(cohort),
        train_loss=float(cw['loss_sum']) / max(float(cw['num_examples']), 1.0),
        non_finite_clients=n_bad, round_seconds=times[-1])
    for key, value in cw.items():     # method-specific sums, e.g. AFedCL L_D
      if key not in ('loss_sum', 'num_examples', 'non_finite', 'extra_sum'):
        row[f'train/{key}_client_mean'] = float(value) / max(
            len(cohort) - n_bad, 1)
    if eval_round:
      summary, rows = evaluate_all(process, server_state, store, client_ids,
                                   dataset_fn, 'test', r)
      if local_eval:
        summary.update(evaluate_local_models(
            process, local_models, cohort, dataset_fn, r, pooled_test))
      client_rows.extend(rows)
      row.update(('test/' + k, v) for k, v in summary.items())
      score = _selection_metric(process, summary)
      entry = collections.OrderedDict(round=r, **summary)
      if has_val:
        vsummary, vrows = evaluate_all(process, server_state, store,
                                       client_ids, dataset_fn, 'val', r)
        client_rows.extend(vrows)
        row.update(('val/' + k, v) for k, v in vsummary.items())
        vscore = _selection_metric(process, vsummary)
        if vscore is not None and vscore > best_val_score:
          best_val_score = vscore
          best_val = collections.OrderedDict(entry)
      if score is not None and score > best_test_score:
        best_test_score, best_test = score, entry
      final = entry
    history.append(row)
    if release_managers:
      event_loop.run_until_complete(_release(release_managers, row, r))
    if checkpoints is not None and (r % checkpoint_every == 0 or r == rounds):
      checkpoints.save(r, server_state, store, dict(
          history=history, clients=client_rows, times=times,
          best_val=best_val, best_test=best_test, final=final,
          best_val_score=best_val_score, best_test_score=best_test_score,
          fingerprint=fingerprint, architecture=architecture))
    if progress is not None:
      progress(r, row)
  event_loop.close()
  if not history or history[-1]['round'] != rounds:
    raise ValueError(f'the checkpoint is at round {len(history)}, past the '
                     f'requested {rounds} rounds.')
  later = [t for i, t in enumerate(times) if i not in warm_up] or times
  return RunResult(rounds=history, clients=client_rows, final=final,
                   best_val=best_val, best_test=best_test or final,
                   seconds_per_round=float(np.mean(later)),
                   first_round_seconds=times[0],
                   server_state=server_state, store=store, process=process,
                   architecture=architecture)
