r"""Prints a Markdown table from the summary.json files under a run folder.

Useful while a multi-algorithm run is still going (or was stopped): every
algorithm that finished has DIR/<algorithm>/summary.json.

  python -m programs.summarize runs/pfl_mnist_dir0.1
"""

import json
import os
import sys


def table(root: str) -> str:
  lines = ['| algorithm | rounds | mean personalized acc | worst-10% acc | '
           'mean macro-F1 | global acc | best acc (round) | s/round |',
           '|---|---|---|---|---|---|---|---|']
  names = sorted(n for n in os.listdir(root)
                 if os.path.exists(os.path.join(root, n, 'summary.json')))
  for name in names:
    with open(os.path.join(root, name, 'summary.json')) as f:
      s = json.load(f)
    fin, best = s['final_round'], s['best_round_on_test']

    def pct(d, key):
      return f'{100 * d[key]:.2f}' if key in d else '-'

    lines.append(
        f"| {name} | {fin['round']} | {pct(fin, 'personal/accuracy_mean')} | "
        f"{pct(fin, 'personal/accuracy_worst10')} | "
        f"{pct(fin, 'personal/macro_f1_mean')} | "
        f"{pct(fin, 'global/accuracy_mean')} | "
        f"{pct(best, 'personal/accuracy_mean')} ({best['round']}) | "
        f"{s['seconds_per_round']:.1f} |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) != 2 or not os.path.isdir(argv[1]):
    print(__doc__)
    return 2
  print(table(argv[1]))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
