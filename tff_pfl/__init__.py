"""tff_pfl: personalized federated learning on TensorFlow Federated.

Subpackages:
  core        the personalized process type, client-state stores, sampling,
              evaluation metrics and the shared round loop.
  templates   reusable client-work, evaluation and finalizer pieces.
  algorithms  one module per algorithm (FedAvg, No-FL, ...).
  data        data sources, seeded partitioners and TFF ClientData.
"""

__version__ = '0.1.0'
