"""Settings file: defaults when missing or broken, clamping of hand-edited values, recent models."""

import json

from app.settings import MAX_RECENT_MODELS, Settings, SettingsFile


def test_missing_or_broken_file_gives_defaults(tmp_path):
    assert SettingsFile(tmp_path / "absent.json").load() == Settings()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert SettingsFile(broken).load() == Settings()


def test_round_trip_and_clamping(tmp_path):
    f = SettingsFile(tmp_path / "s.json")
    s = Settings(theme="dark", font_size=13, presets={"/m.gguf": {"temperature": 0.5}})
    f.save(s)
    assert f.load() == s
    raw = json.loads(f.path.read_text())
    raw.update(theme="purple", font_size=400, context_size=10, threads=-3, unknown_key=1)
    f.path.write_text(json.dumps(raw))
    loaded = f.load()
    assert (loaded.theme, loaded.font_size, loaded.context_size, loaded.threads) == (
        "system",
        28,
        256,
        0,
    )
    assert loaded.presets == {"/m.gguf": {"temperature": 0.5}}


def test_recent_models_most_recent_first_without_duplicates():
    s = Settings()
    for i in range(MAX_RECENT_MODELS + 2):
        s.remember_model(f"/m{i}.gguf")
    s.remember_model("/m5.gguf")
    assert s.recent_models[0] == "/m5.gguf" == s.last_model
    assert len(s.recent_models) == MAX_RECENT_MODELS and s.recent_models.count("/m5.gguf") == 1
