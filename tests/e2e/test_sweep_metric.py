"""A sweep answers the researcher's question (issue 88): a plain DDP script that logs its loss with torch's
SummaryWriter, swept over lr x seed with the seeds as replicas, here (--local). The report's first table is the
script's own val/loss per lr, a mean over the seeds; the best lr is named with its margin and whether it beats
the spread between seeds; step time comes after. The oracle is what the script printed as it logged each value,
not the toolkit's reader."""

import collections
import html
import json
import os
import re
import statistics
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
SCRIPT = SCRIPTS / "summarywriter_ddp.py"
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{Path(PY).parent}:{os.environ['PATH']}")


def f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


LRS = ("sweep:\n  name: lrs\n  gpus: [1]\n  axes:\n    lr: [0.5, 0.005]\n    seed: [1, 2]\n  replicas: seed\n"
       "command:\n  args: [--logdir, '{run_dir}/tb']\nprofiler:\n  wait: 1\n  warmup: 1\n  active: 2\n")


def run_lrs(tmp_path: Path, *where: str) -> Path:
    """The SummaryWriter script's lr x seed sweep, submitted with `where` (--local, or an account and
    --wait); its sweep directory."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(LRS)
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), *where, "--runs-dir", str(tmp_path / "runs"),
                        "--", PY, str(SCRIPT), "--lr", "{lr}", "--seed", "{seed}"],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "runs" / "lrs").glob("sweep-*")
    return sweep_dir


def test_a_scripts_lr_and_seed_sweep_leads_with_its_own_loss_over_the_seeds(tmp_path):
    assert_leads_with_val_loss(run_lrs(tmp_path, "--local"))


@pytest.mark.slurm
def test_the_same_sweep_on_slurm_leads_with_the_same_loss(slurm_cluster, tmp_path):
    """The same, as one job array on the local Slurm cluster, and its analysis job after it."""
    assert_leads_with_val_loss(run_lrs(tmp_path, "--account", "m1_g", "--export", "ALL,OMP_NUM_THREADS=1", "--wait"))


def assert_leads_with_val_loss(sweep_dir: Path) -> None:
    printed: dict[float, list[float]] = {}  # lr -> each seed's last val/loss, as the script printed it
    last: dict[str, str] = {}  # run directory -> its last val/loss and step, as hpc.study status says it
    for run in sweep_dir.iterdir():
        logs = "".join(p.read_text() for p in run.glob("logs/rank0.out"))
        said = re.findall(r"^logged val/loss (\d+) (\S+)$", logs, flags=re.M)
        if said:
            words = json.loads((run / "summary.json").read_text())["command"]
            lr = float(words[words.index("--lr") + 1])
            printed.setdefault(lr, []).append(f32(float(said[-1][1])))
            last[str(run)] = f"val/loss {f32(float(said[-1][1])):.4g} @{said[-1][0]}"
    assert sorted(len(v) for v in printed.values()) == [2, 2], printed
    table = (sweep_dir / "analysis" / "sweep.md").read_text()
    first = table.split("## Performance", 1)[0]
    assert first.startswith("## val/loss, by point\n"), table[:500]
    assert "metric: val/loss (min): the first evaluation loss or accuracy found" in first
    rows = {cells[1].strip(): cells for cells in (line.split("|") for line in first.splitlines()) if len(cells) > 6}
    means = {lr: statistics.fmean(v) for lr, v in printed.items()}
    for lr, values in printed.items():
        row = rows[f"lr={lr:g}"]
        assert row[2].strip() == "2" and float(row[3]) == pytest.approx(means[lr], rel=1e-3), (row, values)
    best, second = sorted(means, key=means.get)
    margin = abs(means[best] - means[second])
    noise = max(max(printed[lr]) - min(printed[lr]) for lr in printed)
    line = next(x for x in first.splitlines() if x.startswith("best val/loss: "))
    assert line.startswith(f"best val/loss: lr={best:g}, "), line
    assert f"than the second, lr={second:g}" in line and ("beyond" if margin > noise else "within") in line, line
    assert "batch" not in first and "fraction" not in first  # settings the script never received
    status = subprocess.run([PY, "-m", "hpc.study", "status", str(sweep_dir), "--format", "json"],
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert {p["run_dir"]: p["metric"] for p in json.loads(status.stdout)} == last, status.stdout[-2000:]
    # TensorBoard's HParams view: a session a point, its lr and seed, its val/loss as the script logged it last
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    tb = EventMultiplexer()
    tb.AddRunsFromDirectory(str(sweep_dir / "analysis" / "hparams"))
    tb.Reload()
    content = tb.PluginRunToTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(content["."][metadata.EXPERIMENT_TAG])
    assert {h.name for h in experiment.hparam_infos} == {"lr", "seed"}
    assert "val/loss" in {m.name.tag for m in experiment.metric_infos}
    sessions = {run: metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
                for run, tags in content.items() if run != "."}
    assert len(sessions) == 4
    for run, start in sessions.items():
        lr = start.hparams["lr"].number_value
        logged = [e.value for e in tb.Scalars(run, "val/loss")]
        assert logged[-1] in printed[lr] and start.hparams["seed"].number_value in (1, 2)
    page = (sweep_dir / "analysis" / "report.html").read_text()
    first_h2 = page.index("<h2>")
    assert page[first_h2:].startswith("<h2>val/loss, by point</h2>"), page[first_h2:first_h2 + 200]
    assert html.escape(line) in page  # the same best line leads the report
    # the script never received a batch size or a data fraction, and never saw CIFAR-100
    assert "batch_size_per_gpu" not in table and "data_fraction" not in table, table.splitlines()[-6]
    assert "CIFAR-100" not in page
    assert "step_mode" not in table and "graph_check" not in table  # the toolkit's facts, none of them a script's
    said = re.findall(r"<li><b>[^<]*</b>: ([^<]*)</li>", page.split('<ul class="verdict">', 1)[1].split("</ul>")[0])
    # a sentence all 4 points say is said once; one that only some say (a measured share that rounds alike on
    # two points) stays each one's (analysis/report/html.py said_once)
    assert said and max(collections.Counter(said).values()) < 4, said
    # the report's first figure is the script's own metric over its steps, a line an lr with its seeds' band
    first_img = page[page.index("<img "):page.index(">", page.index("<img "))]
    assert 'alt="metric_val_loss"' in first_img, first_img[:120]
    assert (sweep_dir / "analysis" / "figures" / "metric_val_loss.png").is_file()


def test_the_toolkits_own_training_swept_over_its_lr_leads_with_its_evaluation_loss(tmp_path, data_root):
    """The toolkit's training through the same code: its metrics.jsonl (and its TensorBoard scalars, the same
    values) give epoch/eval_loss; the report's first table is it, per train.lr. The oracle: metrics.jsonl's
    last epoch line of each point, read here as plain JSON."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("sweep:\n  name: tl\n  gpus: [1]\n  batch_sizes: [32]\n  data_fractions: [1]\n  axes:\n"
                     "    train.lr: [0.2, 0.002]\n")
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--local", "--config",
                        str(REPO / "profiles" / "smoke.yaml"), "--data-root", str(data_root), "--runs-dir",
                        str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "runs" / "tl").glob("sweep-*")
    last = {}
    for run in sweep_dir.iterdir():
        if (run / "metrics.jsonl").is_file():
            epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
                      if '"kind": "epoch"' in line]
            lr = json.loads((run / "summary.json").read_text())["config"]["train"]["lr"]
            last[lr] = epochs[-1]["eval_loss"]
    assert sorted(last) == [0.002, 0.2], last
    first = (sweep_dir / "analysis" / "sweep.md").read_text().split("## Performance", 1)[0]
    assert first.startswith("## epoch/eval_loss, by point\n"), first[:300]
    rows = {cells[1].strip(): cells for cells in (line.split("|") for line in first.splitlines()) if len(cells) > 6}
    for lr, value in last.items():
        assert float(rows[f"train.lr={lr:g}"][3]) == pytest.approx(value, rel=1e-3), (rows, last)
    best = min(last, key=last.get)
    assert f"best epoch/eval_loss: train.lr={best:g}, " in first and "the noise is not measured" in first, first


def sweep_of(tmp_path: Path, name: str, args: str, *words: str, metrics: str | None = None,
             lr_seed_flags: bool = True) -> Path:
    """`hpc.study run` of lr x seed (seeds as replicas) here, of a script given as `words` (its metrics where
    command.metrics says, if set; `--lr {lr} --seed {seed}` after them with lr_seed_flags); its sweep dir."""
    sweep = tmp_path / "sweep.yaml"
    place = f"  metrics: '{metrics}'\n" if metrics else ""
    sweep.write_text(f"sweep:\n  name: {name}\n  gpus: [1]\n  axes:\n    lr: [0.05, 0.001]\n    seed: [1, 2]\n"
                     f"  replicas: seed\ncommand:\n  args: {args}\n{place}")
    own = ["--lr", "{lr}", "--seed", "{seed}"] if lr_seed_flags else []
    r = subprocess.run([PY, "-m", "hpc.study", "run", str(sweep), "--local", "--no-profile", "--runs-dir",
                        str(tmp_path / "runs"), "--", PY, *words, *own],
                       capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "runs" / name).glob("sweep-*")
    return sweep_dir


def table_means(sweep_dir: Path, name: str) -> dict[str, float]:
    first = (sweep_dir / "analysis" / "sweep.md").read_text().split("## Performance", 1)[0]
    assert first.startswith(f"## {name}, by point\n"), first[:300]
    assert f"best {name}: lr=" in first, first
    return {cells[1].strip(): float(cells[3]) for cells in (line.split("|") for line in first.splitlines())
            if len(cells) > 6 and cells[1].strip().startswith("lr=")}


def test_lightnings_image_classifier_example_swept_leads_with_what_its_default_logger_wrote(tmp_path):
    """Lightning's own backbone_image_classifier.py (tests/public/, byte for byte), lr x seed through its
    LightningCLI flags, its default logger (TensorBoardLogger under --trainer.default_root_dir). The oracle:
    its event files read by TensorBoard's low-level loader, each run's last valid_loss_epoch; the default
    metric prefers that epoch's value to one validation batch's (valid_loss_step)."""
    import shutil

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    from publicdata import write_mnist

    basics = tmp_path / "examples" / "pytorch" / "basics"  # its Datasets/ lies two folders up, as in its repository
    basics.mkdir(parents=True)
    script = shutil.copy(REPO / "tests" / "public" / "backbone_image_classifier.py", basics)
    for raw in (tmp_path / "examples" / "Datasets" / "MNIST" / "raw", tmp_path / "data" / "MNIST" / "raw"):
        write_mnist(raw, 60000, 64)  # its random_split takes 55000 + 5000; ./data: Lightning's download check
    flags = ("[--trainer.default_root_dir, '{run_dir}', --trainer.max_epochs, '2', --trainer.limit_train_batches,"
             " '20', --trainer.limit_val_batches, '4', --trainer.accelerator, cpu, --trainer.enable_progress_bar,"
             " 'false', --model.learning_rate, '{lr}', --seed_everything, '{seed}']")
    sweep_dir = sweep_of(tmp_path, "pl", flags, str(script), lr_seed_flags=False)
    last: dict[float, list[float]] = {}
    for run in sweep_dir.glob("*/summary.json"):
        values = [(e.step, v.simple_value if v.HasField("simple_value") else make_ndarray(v.tensor).item())
                  for events in run.parent.glob("lightning_logs/version_*/events.out.tfevents.*")
                  for e in EventFileLoader(str(events)).Load() for v in e.summary.value if v.tag == "valid_loss_epoch"]
        words = json.loads(run.read_text())["command"]
        last.setdefault(float(words[words.index("--model.learning_rate") + 1]), []).append(max(values)[1])
    assert sorted((lr, len(v)) for lr, v in last.items()) == [(0.001, 2), (0.05, 2)], last
    means = table_means(sweep_dir, "valid_loss_epoch")
    for lr, values in last.items():
        assert means[f"lr={lr:g}"] == pytest.approx(statistics.fmean(values), rel=1e-3), (means, last)


def test_an_hf_trainer_scripts_sweep_leads_with_its_trainer_states_loss(tmp_path):
    """The HF Trainer's trainer_state.json (report_to none: no TensorBoard), its last checkpoint's, written
    where the script's --output_dir says, outside the run directory: command.metrics names that place. The
    oracle: that file's log_history, read as plain JSON."""
    sweep_dir = sweep_of(tmp_path, "hf", "[--output_dir, 'out/lr{lr}-s{seed}', --epochs, '1']",
                         str(SCRIPTS / "hf_trainer.py"), metrics="out/lr{lr}-s{seed}")
    last: dict[float, list[float]] = {}
    for out in (tmp_path / "out").iterdir():
        states = sorted(out.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
        history = json.loads(states[-1].read_text())["log_history"]
        last.setdefault(float(out.name[2:].split("-s")[0]), []).append([h["loss"] for h in history if "loss" in h][-1])
    assert sorted((lr, len(v)) for lr, v in last.items()) == [(0.001, 2), (0.05, 2)], last
    means = table_means(sweep_dir, "loss")
    for lr, values in last.items():
        assert means[f"lr={lr:g}"] == pytest.approx(statistics.fmean(values), rel=1e-3), (means, last)
