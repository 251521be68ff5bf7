import pytest
import torch

import mmpe
from mmpe import registry

FOUNDATION = {"sinusoidal", "learned", "rope", "alibi", "t5", "fire", "nope"}


def test_foundation_methods_registered_with_metadata():
    names = {e.name for e in mmpe.available()}
    assert FOUNDATION <= names
    assert {e.name for e in mmpe.available(hook="rotary")} >= {"rope"}
    assert registry.get("alibi").hook == "score"
    assert registry.get("learned").learnable and not registry.get("learned").extrapolates
    assert not registry.get("rope").learnable
    assert all(e.paper for e in mmpe.available())
    assert all("sequence" in e.coords for e in mmpe.available(coords="sequence"))


def test_unknown_name_lists_at_most_five_close_ones():
    with pytest.raises(KeyError) as err:
        mmpe.build("ropee")
    message = err.value.args[0]
    assert "`mmpe list` shows all" in message and len(message) < 200, message
    assert message.count("'") <= 2 * 6  # the name and at most five matches
    with pytest.raises(KeyError, match="unknown encoding 'zzzzqq'. `mmpe list` shows all"):
        mmpe.build("zzzzqq")
    with pytest.raises(KeyError, match="Did you mean 'rope'"):
        mmpe.build("ropee")
    with pytest.raises(KeyError, match="Did you mean 'alibi'"):
        mmpe.build("albi")


def test_build_from_name_config_and_context():
    a = mmpe.build("alibi", num_heads=4)
    b = mmpe.build({"name": "t5", "num_heads": 4, "num_buckets": 16})
    assert b.num_buckets == 16 and a.num_heads == 4
    # Context fills only the options an encoding takes; explicit options win.
    r = mmpe.build("rope", context={"head_dim": 32, "num_heads": 4, "d_model": 128})
    assert r.head_dim == 32
    s = mmpe.build({"name": "sinusoidal", "d_model": 16}, context={"d_model": 64})
    assert s.d_model == 16


def test_build_rejects_unknown_options_and_bad_configs():
    with pytest.raises(TypeError, match="alibi"):
        mmpe.build("alibi", num_heads=4, bogus=1)
    with pytest.raises(KeyError, match="'name'"):
        mmpe.build({"num_heads": 4})
    with pytest.raises(TypeError, match="str or a mapping"):
        mmpe.build(3)
    with pytest.raises(ValueError, match="hook must be one of"):
        mmpe.available(hook="bias")


def test_register_checks_hook_and_duplicates():
    with pytest.raises(ValueError, match="hook must be one of"):
        registry.register("x_bad", hook="middle", learnable=False, paper="-")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("rope", hook="rotary", learnable=False, paper="-")(type("X", (), {}))


def test_coords_check_uses_registry_metadata():
    enc = mmpe.build("sinusoidal", d_model=8)
    assert enc.needs == registry.get("sinusoidal").needs
    with pytest.raises(TypeError, match="Coordinates"):
        enc(torch.arange(4))
