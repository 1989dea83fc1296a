"""The probe fitting's public names, where callers have always imported them from; the fit itself
lives in `evaluators.fitting` (one module per stage)."""

from evaluators.fitting import (FitResult, ProbeJob, RowReader, TrainConfig, auto_batch_size, class_directions,
                                feature_stats, fit_probes, resolve_device, saving_and_se, warm_start_from)

__all__ = ["FitResult", "ProbeJob", "RowReader", "TrainConfig", "auto_batch_size", "class_directions", "feature_stats",
           "fit_probes", "resolve_device", "saving_and_se", "warm_start_from"]
