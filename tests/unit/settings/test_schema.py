"""hpc/settings/schema.py: which keys may change on a resume, marked on the fields."""



def test_which_keys_may_change_on_resume_is_marked_on_the_fields():
    from hpc.settings.schema import may_change_on_resume

    assert all(may_change_on_resume(*k.split(".")) for k in (
        "data.root", "data.num_workers", "train.max_steps", "train.eval", "train.cuda_memory_fraction",
        "profiler.enabled", "profiler.active", "profiler.memory_snapshot"))
    assert not any(may_change_on_resume(*k.split(".")) for k in (
        "train.batch_size", "train.lr", "train.seed", "model.arch", "data.fraction", "data.augment", "train.nokey"))
