"""Measurement: which global encoder AFedCL's fused model is evaluated with.

The library evaluates client k's personalized model C_k(A_k E_G(x) +
(1 - A_k) E_k(x)) with the newest global encoder, E_G^{t+1} after round t
(`tff_pfl.algorithms.afedcl`), while C_k and A_k were fitted against E_G^t.
This reruns one committed AFedCL cell from its summary.json (same config and
seed, so the E_G^{t+1} accuracies reproduce the committed rounds.csv) and at
every evaluation round also evaluates with E_G^t, the encoder broadcast in
that round.

  .venv/bin/python scripts/afedcl_eval_encoder.py \\
      docs/tables/afedcl_200/disjoint_2_k5/seed0/afedcl/summary.json \\
      [--data_dir=../shared/data]

Prints one line per evaluation and the mean difference, in points.
"""

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_pfl import experiment
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import process as process_lib
from tff_pfl.core import runtime
from tff_pfl.core import sampling

_NEXT = 'test/personal/accuracy_mean'
_BROADCAST = 'test/personal_with_broadcast/accuracy_mean'


def with_broadcast_evaluation(
    process: process_lib.PersonalizedProcess
) -> process_lib.PersonalizedProcess:
  """`process` whose evaluation also reports the personalized model with
  the server state of the round's start (E_G^t), as kind
  'personal_with_broadcast'; `loop.run` summarises it like 'personal'."""
  broadcast = {}

  def next_(server_state, client_states, datasets):
    broadcast['state'] = server_state
    return process.next(server_state, client_states, datasets)

  def evaluate(server_state, client_states, datasets):
    out = dict(process.evaluate(server_state, client_states, datasets))
    out['personal_with_broadcast'] = process.evaluate(
        broadcast['state'], client_states, datasets)['personal']
    return out

  return dataclasses.replace(process, next=next_, evaluate=evaluate)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('summary', help="an AFedCL cell's summary.json")
  parser.add_argument('--data_dir', default='../shared/data')
  args = parser.parse_args()
  with open(args.summary) as f:
    summary = json.load(f)
  if summary['algorithm'].split(':')[0] != 'afedcl':
    raise SystemExit(f'{args.summary} is a {summary["algorithm"]!r} cell, '
                     'not an AFedCL one.')
  if not os.path.isdir(args.data_dir):
    raise SystemExit(f'--data_dir {args.data_dir!r} is not a folder.')
  config = experiment.ExperimentConfig(
      **dict(summary['config'], data_dir=args.data_dir))
  data = experiment.prepare(config)
  process = experiment.build_process(config, data, 'afedcl')
  result = loop.run(
      with_broadcast_evaluation(process), client_ids=data.client_ids,
      dataset_fn=data.dataset_fn,
      sampler=sampling.ParticipationStream(
          data.client_ids, clients_per_round=config.clients_per_round,
          seed=config.seed),
      rounds=config.rounds,
      store=client_state.MemoryStore(process.initial_client_state),
      eval_every=config.eval_every, has_val=data.has_val)
  runtime.shutdown()
  diffs = []
  for row in result.rounds:
    if _NEXT not in row:
      continue
    acc_next, acc_broadcast = 100 * row[_NEXT], 100 * row[_BROADCAST]
    diffs.append(acc_next - acc_broadcast)
    print(f'round {row["round"]}: with E_G^(t+1) {acc_next:.2f}, with E_G^t '
          f'{acc_broadcast:.2f}, difference {diffs[-1]:+.2f}')
  mean = sum(diffs) / len(diffs)
  print(f'{args.summary}: E_G^(t+1) minus E_G^t over {len(diffs)} '
        f'evaluations: mean {mean:+.2f}, min {min(diffs):+.2f}, '
        f'max {max(diffs):+.2f} points')
  return 0


if __name__ == '__main__':
  sys.exit(main())
