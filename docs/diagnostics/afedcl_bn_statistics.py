"""Diagnostic: where does AFedCL `local_statistics=true` lose on ResNet-50?

Restores a finished AFedCL cell's newest checkpoint (server state and every
client state) and evaluates each client's fused model (Eq. 9) on its test
split with E_G's BatchNorm statistics taken five ways:
  kept         the client's kept statistics (what the run evaluates),
  server       the server's (the average of the clients' E_k statistics),
  reestimated  the kept ones after 60 training-mode passes of E_G over the
               client's training data (statistics for the current E_G),
  batch        E_G in training mode on each test batch (batch statistics),
  local_only   no fusion: C_k on E_k alone.
Run from the repository root (forty-first session, docs/results.md):
  PYTHONPATH=. .venv/bin/python docs/diagnostics/afedcl_bn_statistics.py \
    runs/afedcl_fig9a/disjoint_2_k5_resnet50/seed0/afedcl_local_statistics=true
"""
import json, sys
import numpy as np
import tensorflow as tf
from tff_pfl import experiment
from tff_pfl.core import checkpoint as checkpoint_lib
from tff_pfl.core import client_state, loop
from tff_pfl.core import metrics as metrics_lib
from tff_pfl.templates import evaluation
from tff_pfl.templates import fusion
from tff_pfl.core import model_spec as model_spec_lib
from tff_pfl.core import process as process_lib

cell = sys.argv[1]
cfg = json.load(open(f'{cell}/summary.json'))['config']
config = experiment.ExperimentConfig(**cfg)
data = experiment.prepare(config)
process = experiment.build_process(config, data, 'afedcl')
template = process.initialize()
store = client_state.MemoryStore(process.initial_client_state)
restored = checkpoint_lib.CheckpointManager(f'{cell}/checkpoints').restore_latest(template, store)
rnd = restored.round_num
summary, _ = loop.evaluate_all(process, restored.server_state, store, data.client_ids,
                               data.dataset_fn, 'test', rnd)
print('round', rnd, 'as evaluated: acc %.4f loss %.2f' % (summary['personal/accuracy_mean'], summary['personal/loss_mean']))
gw = process.get_model_weights(restored.server_state)
_, n_enc, n_enc_nt = data.spec.encoder_sizes('AFedCL')

def run(cid, variant):
  st = store.get(cid)
  lm, gm = data.spec.keras_model_fn(), data.spec.keras_model_fn()
  model_spec_lib.assign_weights(lm, process_lib._as_model_weights(st.model_weights))
  eg = gm.get_layer('encoder')
  for v, w in zip(eg.trainable_weights, gw.trainable[:n_enc]): v.assign(w)
  stats = st.global_statistics if variant in ('kept', 'reestimated', 'batch') else gw.non_trainable[:n_enc_nt]
  for v, w in zip(eg.non_trainable_weights, stats): v.assign(w)
  if variant == 'reestimated':
    for _ in range(60):
      for b in data.dataset_fn(cid, rnd, 'train'):
        eg(b['x'], training=True)
  el, head = lm.get_layer('encoder'), lm.get_layer('head')

  def predict(x, training=False):
    del training   # evaluation; only E_G's mode varies ('batch')
    if variant == 'local_only':
      return head(el(x, training=False), training=False)
    fg = eg(x, training=(variant == 'batch'))
    return head(fusion.fuse(fg, el(x, training=False), st.fusion_logit),
                training=False)

  m = metrics_lib.client_metrics(evaluation.evaluate_model(
      data.spec, predict, data.dataset_fn(cid, rnd, 'test')))
  return m['loss'], m['accuracy']

for variant in ('kept', 'server', 'reestimated', 'batch', 'local_only'):
  res = [run(c, variant) for c in data.client_ids]
  print(f'{variant:12s} acc %.4f loss %.2f  per-client acc %s loss %s' % (
      np.mean([a for _, a in res]), np.mean([l for l, _ in res]),
      [round(a, 3) for _, a in res], [round(l, 1) for l, _ in res]), flush=True)
