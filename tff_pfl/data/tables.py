"""Loads tabular data sets from CSV files."""

from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from tff_pfl.data import dataset

def load_csv(
    path: dataset.PathLike,
    *,
    target: str,
    task: str = dataset.CLASSIFICATION,
    categorical: Union[str, Sequence[str]] = 'auto',
    drop: Sequence[str] = (),
    name: Optional[str] = None,
    standardize: bool = True,
) -> dataset.ArrayDataset:
  """Loads a tabular data set from a CSV file.

  Reading is forgiving about the quirks of public CSV files: a UTF-8 byte
  order mark is removed (`encoding='utf-8-sig'`) and column names are
  stripped of surrounding whitespace, so `target='Life expectancy'` matches
  the column 'Life expectancy '.

  Preprocessing, in order:

  1.  Rows whose target is missing are dropped.
  2.  Columns in `drop` are removed.
  3.  Categorical columns are one-hot encoded with one indicator per sorted
      category, named '<column>=<value>'; a missing value gives all zeros.
  4.  Missing numeric values are replaced by the column median.
  5.  If `standardize`, numeric columns (not the indicators) are scaled to
      zero mean and unit variance. The statistics come from the full table,
      so per-client test rows influence them; refitting on training rows
      only is left to the caller.

  A classification target is label-encoded in sorted order of its values
  (numbers numerically, strings lexicographically); `class_names` holds the
  values as strings. A regression target is converted to float32.

  Args:
    path: The CSV file.
    target: Name of the target column (surrounding whitespace ignored).
    task: 'classification' or 'regression'.
    categorical: 'auto' to one-hot encode exactly the non-numeric columns,
      or a list of column names to encode in addition to them (for integer
      coded categories such as 'cp' in the heart disease table).
    drop: Columns to leave out (names stripped like the header).
    name: Data set name; defaults to the file name without extension.
    standardize: Whether to standardize the numeric feature columns.

  Returns:
    An `ArrayDataset` with everything in `x_train`; `feature_names` lists
    the (expanded) feature columns.

  Raises:
    FileNotFoundError: If `path` does not exist.
    ValueError: If `target`, a `drop` or `categorical` column is not in the
      table, `task` is unknown, a regression target is not numeric, a
      numeric column has no values at all, or no rows are left.
  """
  # pylint: disable-next=import-outside-toplevel
  import pandas as pd

  path = dataset.existing_path(path)
  name = name or path.stem
  if task not in dataset.TASKS:
    raise ValueError(f'task must be one of {dataset.TASKS}, got {task!r}.')
  try:
    table = pd.read_csv(path, encoding='utf-8-sig')
  except (UnicodeDecodeError, pd.errors.ParserError,
          pd.errors.EmptyDataError) as e:
    raise ValueError(f'{str(path)!r} is not a readable UTF-8 CSV table: '
                     f'{e}') from e
  table.columns = [str(c).strip() for c in table.columns]
  columns = list(table.columns)
  if len(set(columns)) != len(columns):
    duplicates = sorted({c for c in columns if columns.count(c) > 1})
    raise ValueError(
        f'{str(path)!r} has duplicate column names after stripping '
        f'whitespace: {duplicates}.'
    )
  target = target.strip()
  if target not in columns:
    raise ValueError(
        f'Target column {target!r} is not in {str(path)!r}; columns are '
        f'{columns}.'
    )
  drop = [d.strip() for d in drop]
  unknown = [d for d in drop if d not in columns]
  if unknown:
    raise ValueError(
        f'Cannot drop {unknown}: not in {str(path)!r}; columns are {columns}.'
    )
  if isinstance(categorical, str):
    if categorical != 'auto':
      raise ValueError(
          f"categorical must be 'auto' or a list of column names, got "
          f'{categorical!r}.'
      )
    forced = []
  else:
    forced = [c.strip() for c in categorical]
    unknown = [c for c in forced if c not in columns or c == target]
    if unknown:
      raise ValueError(
          f'Categorical columns {unknown} are not feature columns of '
          f'{str(path)!r}; columns are {columns}.'
      )

  table = table[table[target].notna()].reset_index(drop=True)
  if table.empty:
    raise ValueError(f'{str(path)!r} has no rows with a value for {target!r}.')
  y_raw = table[target]
  features = table.drop(columns=[target, *drop])

  blocks = []
  feature_names = []
  for column in features.columns:
    values = features[column]
    is_numeric = pd.api.types.is_numeric_dtype(
        values
    ) and not pd.api.types.is_bool_dtype(values)
    if is_numeric and column not in forced:
      if values.isna().all():
        raise ValueError(
            f'Column {column!r} of {str(path)!r} has no values; drop it.'
        )
      filled = values.fillna(values.median()).to_numpy(dtype=np.float64)
      if standardize:
        std = filled.std()
        filled = (filled - filled.mean()) / (std if std > 0 else 1.0)
      blocks.append(filled[:, np.newaxis])
      feature_names.append(column)
    else:
      categories = sorted(values.dropna().unique(), key=_sort_key)
      for category in categories:
        blocks.append((values == category).to_numpy(np.float64)[:, None])
        feature_names.append(f'{column}={_format_value(category)}')
  if not blocks:
    raise ValueError(f'{str(path)!r} has no feature columns left.')
  x = np.concatenate(blocks, axis=1).astype(np.float32)

  if task == dataset.CLASSIFICATION:
    class_values = sorted(y_raw.unique(), key=_sort_key)
    class_index = {v: i for i, v in enumerate(class_values)}
    y = np.array([class_index[v] for v in y_raw], dtype=np.int64)
    class_names = tuple(_format_value(v) for v in class_values)
    num_classes = len(class_names)
  else:
    if not pd.api.types.is_numeric_dtype(y_raw):
      raise ValueError(
          f'Regression target {target!r} of {str(path)!r} is not numeric '
          f'(dtype {y_raw.dtype}).'
      )
    y = y_raw.to_numpy(dtype=np.float32)
    class_names = ()
    num_classes = 0
  return dataset.ArrayDataset(
      name=name,
      x_train=x,
      y_train=y,
      x_test=None,
      y_test=None,
      num_classes=num_classes,
      class_names=class_names,
      task=task,
      feature_names=tuple(feature_names),
  )


def _sort_key(value: Any) -> tuple[int, Any]:
  """Sorts numbers numerically before strings lexicographically."""
  if isinstance(value, (int, float, np.integer, np.floating)):
    return (0, float(value))
  return (1, str(value))


def _format_value(value: Any) -> str:
  if isinstance(value, (float, np.floating)) and float(value).is_integer():
    return str(int(value))
  return str(value)
