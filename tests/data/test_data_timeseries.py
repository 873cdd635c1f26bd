"""Time series data: the .ts parser (checked against sktime's), users' .ts / CSV files, the bundled UCR/UEA
sets, and the elecdemand forecasting protocol with its baselines, loaded with every socket call blocked."""

from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.config import load_recipe
from zoo.data import DataContext, build_dataset
from zoo.data.collate import PadCollate
from zoo.data.series.classification import UCR, CsvSeriesDataset, TsFileDataset, bundled_ucr_names, read_ts
from zoo.data.series.forecast import Elecdemand, ForecastWindows, linear_forecast_scores, seasonal_naive_scores

# Every test here runs with socket connects and name lookups raising.
pytestmark = pytest.mark.usefixtures("no_network")


TS_FILE = """# a comment
@problemName Toy
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true up down
@data
1,2,3,4:5,6,7,8:up
1.5,?,2.5:0,?,1:down
9,8:7,6:up
"""


def test_read_ts_unequal_multivariate_with_missing(tmp_path):
    path = tmp_path / "toy.ts"
    path.write_text(TS_FILE)
    data = read_ts(path)
    assert data.class_names == ("up", "down") and data.labels == ["up", "down", "up"]
    assert [s.shape for s in data.series] == [(2, 4), (2, 3), (2, 2)]
    np.testing.assert_array_equal(data.series[1][0], [1.5, np.nan, 2.5])
    with pytest.raises(FileNotFoundError, match="absent.ts"):
        read_ts(tmp_path / "absent.ts")
    path.write_text(TS_FILE.replace("@timeStamps false", "@timeStamps true"))
    with pytest.raises(ValueError, match="time-stamped"):
        read_ts(path)


def test_ts_dataset_pads_and_masks(tmp_path):
    path = tmp_path / "toy.ts"
    path.write_text(TS_FILE)
    dataset = TsFileDataset(path, nan="mask")
    sample = dataset[1]
    assert sample["values"].shape == (3, 2) and sample["values"].dtype == torch.float32
    # step 1 is missing in both channels: masked out and zero-filled
    assert sample["mask"].tolist() == [True, False, True] and sample["values"][1].tolist() == [0.0, 0.0]
    batch = PadCollate()([dataset[i] for i in range(3)])
    assert batch["values"].shape == (3, 4, 2) and batch["label"].tolist() == [0, 1, 0]
    assert batch["mask"].tolist() == [[True] * 4, [True, False, True, False], [True, True, False, False]]
    assert (batch["values"][2, 2:] == 0).all()


def test_csv_series_dataset(tmp_path):
    path = tmp_path / "series.csv"
    path.write_text("t0,t1,t2,label,t3\n1,2,3,b,4\n5,6,,a,\n")
    dataset = CsvSeriesDataset(path)
    assert dataset.classes == ("a", "b") and len(dataset) == 2
    assert dataset[0]["values"][:, 0].tolist() == [1, 2, 3, 4] and int(dataset[0]["label"]) == 1
    assert dataset[1]["values"].shape == (2, 1) and int(dataset[1]["label"]) == 0
    z = CsvSeriesDataset(path, znorm=True)[0]["values"][:, 0]
    assert abs(float(z.mean())) < 1e-6 and abs(float(z.std(unbiased=False)) - 1) < 1e-5
    with pytest.raises(ValueError, match="not among the classes"):
        CsvSeriesDataset(path, classes=("a",))
    with pytest.raises(ValueError, match="'class'"):
        CsvSeriesDataset(path, label_column="class")
    with pytest.raises(FileNotFoundError, match="gone.csv"):
        CsvSeriesDataset(tmp_path / "gone.csv")


def test_augmentation_slices_scales_and_jitters_the_training_split_only(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(
        "t0,t1,t2,t3,t4,t5,t6,t7,label\n" + "\n".join(",".join(map(str, range(i, i + 8))) + ",a" for i in range(4))
    )
    (tmp_path / "val.csv").write_text(path.read_text())
    options = {"crop": 0.5, "scale": 0.1, "jitter": 0.05}

    def split(name, **extra):
        return build_dataset("csv", DataContext(name, is_training=name == "train", root=str(tmp_path)), **extra)

    plain, val = split("train")[0]["values"][:, 0], split("val", **options)[0]["values"][:, 0]
    assert plain.tolist() == list(range(8)) and val.tolist() == plain.tolist()
    # window slicing: 4 consecutive steps of the 8, starting anywhere
    cropper = split("train", crop=0.5)
    sliced = [cropper[0]["values"][:, 0].tolist() for _ in range(20)]
    assert all(d == list(range(int(d[0]), int(d[0]) + 4)) for d in sliced)
    assert len({d[0] for d in sliced}) > 1 and {d[0] for d in sliced} <= set(range(5))
    # scaling and jitter: the whole series, near its values, a new draw each time
    noisy = split("train", scale=0.1, jitter=0.05)
    draws = [noisy[0]["values"][:, 0] for _ in range(20)]
    assert all(torch.allclose(d, plain, rtol=0.5, atol=0.5) for d in draws)
    assert not all(torch.equal(draws[0], d) for d in draws[1:])
    # the same seed draws the same stream
    again = split("train", **options)
    assert torch.equal(again[0]["values"], split("train", **options)[0]["values"])
    # a recipe names the key, the value and the range
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "ucr_plaid_quick.yaml"
    with pytest.raises(ValueError, match=r"data.options.crop.*\(0, 1\].*got 0"):
        load_recipe(recipe, ["data.options.crop=0"])


def test_bundled_names_checked_before_loading():
    names = bundled_ucr_names()
    assert {"ACSF1", "PLAID", "JapaneseVowels", "BasicMotions", "OSULeaf"} <= set(names)
    assert "Tecator" not in names  # a regression set
    with pytest.raises(ValueError, match="did you mean 'PLAID'"):
        UCR("PLAD", "train")


def test_parser_matches_sktime():
    from sktime.datasets import load_from_tsfile

    from zoo.data.series.classification import _sktime_data_dir

    path = _sktime_data_dir() / "JapaneseVowels" / "JapaneseVowels_TRAIN.ts"
    frame, labels = load_from_tsfile(str(path), return_data_type="nested_univ")
    ours = read_ts(path)
    assert len(ours.series) == len(frame) == 270 and list(labels) == ours.labels
    for case in (0, 7, 269):
        expected = np.stack([frame.iloc[case, channel].to_numpy() for channel in range(12)])
        np.testing.assert_allclose(ours.series[case], expected)


def test_ucr_acsf1_splits():
    train, val, test = (UCR("ACSF1", split) for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (80, 20, 100)
    assert not set(train.rows) & set(val.rows) and sorted([*train.rows, *val.rows]) == list(range(100))
    assert np.bincount(val.labels).tolist() == [2] * 10 and train.num_classes == 10
    sample = train[0]
    assert sample["values"].shape == (1460, 1) and sample["mask"].all()
    assert np.array_equal(UCR("ACSF1", "val").rows, val.rows)


def test_ucr_unequal_lengths_are_padded():
    plaid = UCR("PLAID", "test")
    assert len(plaid) == 537 and plaid.num_classes == 11 and plaid.max_length == 1000
    lengths = [len(plaid[i]["values"]) for i in range(4)]
    batch = PadCollate(pad_to_multiple=128)([plaid[i] for i in range(4)])
    assert batch["values"].shape[1] % 128 == 0 and batch["values"].shape[1] >= max(lengths)
    assert batch["mask"].sum(1).tolist() == lengths and len(set(lengths)) > 1
    vowels = UCR("JapaneseVowels", "train")[0]
    assert vowels["values"].shape[1] == 12


def test_elecdemand_protocol():
    train, val, test = (Elecdemand(split, lookback=512, horizon=96) for split in ("train", "val", "test"))
    assert (train.n_train, train.n_val, train.n_test) == (12_264, 1_752, 3_504)
    assert (len(train), len(val), len(test)) == (12_264 - 512 - 96 + 1, 1_752 - 96 + 1, 3_504 - 96 + 1)
    from zoo.data.series.forecast import _elecdemand

    raw = _elecdemand()
    assert raw.shape == (17_520, 3)
    np.testing.assert_allclose(train.mean, raw[:12_264].mean(axis=0))
    np.testing.assert_allclose(train.std, raw[:12_264].std(axis=0))
    assert not np.allclose(train.mean, raw.mean(axis=0))
    first, last = test[0], test[len(test) - 1]
    assert first["values"].shape == (512, 3) and first["target"].shape == (96, 1)
    # the first test window predicts the first test step, its look-back reaching into val; the last ends at T
    scaled = (raw - train.mean) / train.std
    np.testing.assert_allclose(first["target"][:, 0], scaled[14_016 : 14_016 + 96, 0], rtol=1e-5)
    np.testing.assert_allclose(first["values"].numpy(), scaled[14_016 - 512 : 14_016], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(last["target"][-1, 0], scaled[-1, 0], rtol=1e-5)
    assert val.first_start == 12_264 - 512


@pytest.mark.parametrize("horizon", [96, 192, 336, 720])
def test_elecdemand_horizons(horizon):
    test = Elecdemand("test", lookback=336, horizon=horizon, inputs=("Demand",))
    assert len(test) == 3_504 - horizon + 1 and test[0]["target"].shape == (horizon, 1)
    assert test[0]["values"].shape == (336, 1)


def test_baselines_on_elecdemand():
    train, test = Elecdemand("train", horizon=96), Elecdemand("test", horizon=96)
    naive = seasonal_naive_scores(test, period=48)
    # the same baseline from the samples themselves: yesterday's last 48 half-hours, twice; Demand is column 0
    errors = [np.tile(item["values"][-48:, 0].numpy(), 2) - item["target"][:, 0].numpy() for item in test]
    assert naive["mse"] == pytest.approx(np.mean(np.square(errors)), rel=1e-5)
    assert naive["mae"] == pytest.approx(np.mean(np.abs(errors)), rel=1e-5)
    linear = linear_forecast_scores(train, test)
    assert linear["mse"] < naive["mse"] and linear["mae"] < naive["mae"]


def test_baselines_exact_on_periodic_series():
    steps = np.arange(2_000)
    data = np.stack([np.sin(2 * np.pi * steps / 24), np.cos(2 * np.pi * steps / 24)], axis=1)
    test = ForecastWindows(data, ("a", "b"), "test", lookback=96, horizon=48, targets=("a", "b"))
    train = ForecastWindows(data, ("a", "b"), "train", lookback=96, horizon=48, targets=("a", "b"))
    assert seasonal_naive_scores(test, period=24)["mse"] < 1e-10
    assert linear_forecast_scores(train, test, ridge=1e-9)["mse"] < 1e-6
    with pytest.raises(ValueError, match="period"):
        seasonal_naive_scores(test, period=200)


def test_forecast_csv(tmp_path):
    path = tmp_path / "load.csv"
    rows = [f"2024-01-01 {i:05d},{np.sin(i / 5):.5f},{i % 7}" for i in range(400)]
    path.write_text("date,load,weekday\n" + "\n".join(rows) + "\n")
    test = ForecastWindows.from_csv(path, "test", lookback=24, horizon=8, targets=("load",))
    assert test.columns == ("load", "weekday") and len(test) == 80 - 8 + 1
    # the numbers as written, scaled by the first 280 rows' (70 %) mean and population std; test's first window
    # predicts rows 320-327 (its first 8 rows, after 280 train and 40 val) from the 24 rows before them
    raw = np.array([[float(f"{np.sin(i / 5):.5f}"), i % 7] for i in range(400)])
    scaled = (raw - raw[:280].mean(0)) / raw[:280].std(0)
    np.testing.assert_allclose(test[0]["values"].numpy(), scaled[296:320], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(test[0]["target"].numpy(), scaled[320:328, :1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(test[-1]["target"].numpy(), scaled[392:400, :1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="targets"):
        ForecastWindows.from_csv(path, "test", lookback=24, horizon=8, targets=("date",))
    with pytest.raises(ValueError, match="leave no"):
        ForecastWindows.from_csv(path, "val", lookback=24, horizon=48, targets=("load",))
