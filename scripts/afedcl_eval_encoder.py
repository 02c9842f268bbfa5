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
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_pfl import experiment
from tff_pfl.core import client_state
from tff_pfl.core import loop
from tff_pfl.core import runtime
from tff_pfl.core import sampling

_KEY = 'personal/accuracy_mean'


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
  store = client_state.MemoryStore(process.initial_client_state)
  sampler = sampling.ParticipationStream(
      data.client_ids, clients_per_round=config.clients_per_round,
      seed=config.seed)
  server_state = process.initialize()
  diffs = []
  for r in range(1, config.rounds + 1):
    cohort = sampler.sample(r)
    broadcast_state = server_state                      # holds E_G^t
    server_state, new_states, _ = process.next(
        server_state, store.get_many(cohort),
        [data.dataset_fn(c, r, 'train') for c in cohort])
    store.put_many(cohort, list(new_states))
    if r % config.eval_every and r != config.rounds:
      continue
    acc = {}
    for name, state in (('next', server_state), ('broadcast', broadcast_state)):
      stats, _ = loop.evaluate_all(process, state, store, data.client_ids,
                                   data.dataset_fn, 'test', r)
      acc[name] = 100 * stats[_KEY]
    diffs.append(acc['next'] - acc['broadcast'])
    print(f'round {r}: with E_G^(t+1) {acc["next"]:.2f}, with E_G^t '
          f'{acc["broadcast"]:.2f}, difference {diffs[-1]:+.2f}', flush=True)
  runtime.shutdown()
  mean = sum(diffs) / len(diffs)
  print(f'{args.summary}: E_G^(t+1) minus E_G^t over {len(diffs)} '
        f'evaluations: mean {mean:+.2f}, min {min(diffs):+.2f}, '
        f'max {max(diffs):+.2f} points')
  return 0


if __name__ == '__main__':
  sys.exit(main())
