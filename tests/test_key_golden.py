"""Golden keys: every plan hash, family hash, stored plan text and store key is byte for byte what it was.

Stored decisions and observed-OOM facts are found by these keys; a key that changes loses them on upgrade.
The hex strings below were computed by the code as of commit 0dc253a (which wrote the canonical text directly,
with json's general path as its specification). The library versions are fixed here, since a real key holds
the installed ones.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from strategies import upstream_meta
from test_store_support import make_plan

from prescreen import key
from prescreen.budget import Budget
from prescreen.expr import Add, Axis, Const, FloorDiv, Mul, RuntimeArg
from prescreen.key import KeyParts, build_key, plan_hashes
from prescreen.plan import GroupFeature, KernelPlan, SizeArg, TensorArg, WorkspaceArg, canonical_json

VERSIONS = (("torch", "2.13.0+cpu"), ("torch_npu", "absent"), ("triton", "3.6.0"), ("triton-ascend", "absent"))


class Name(str):
    pass


def _hand_built() -> KernelPlan:
    """Every argument kind and expression node, unicode names, repeated statics, unsorted repeated mutated names."""
    x, r = Axis("x0"), Axis("r0")
    return KernelPlan(
        group_features=(GroupFeature("x", "primary_axis", ("x0",), (8, 64, 2**40)),
                        GroupFeature("r\u00e9", "reduction_product", ("r0", "s0"), (4, 16))),
        axis_names=("x0", "r0", "s0", "s1"),
        axis_static_values=(("s1", 3), ("s0", 7), ("s1", 5)),
        args=(
            TensorArg("out_ptr0", "buffer", (x, Mul((r, Const(2)))), (Mul((r, Const(2))), Const(1)), "torch.bfloat16",
                      "cuda:0"),
            TensorArg("c\u2603\"\\", "constant", (Add((x, Const(1))), FloorDiv(r, Const(3))), (Const(0), Const(1)),
                      "float16", ""),
            TensorArg("rt", "buffer", (RuntimeArg(2), Axis("s0")), (Axis("s0"), Const(1)), "torch.int64", "npu:1"),
            WorkspaceArg("ws", Mul((x, Axis("s1"))), "torch.uint8", "cuda:0", "ZERO_ON_CALL"),
            SizeArg("xnumel", "axis_expr", expr=Mul((x, Const(2)))),
            SizeArg("ks0", "runtime_arg", index=1),
        ),
        mutated_arg_names=("ws", "out_ptr0", "ws"),
        kernel_name="triton_red_fused_\u00e9_1",
        axis_labels=(("x0", "batch in (8, 64]"),),
    )


def _plans() -> dict[str, KernelPlan]:
    upstream = KernelPlan.from_payload(upstream_meta())
    hand = _hand_built()
    arg = upstream.args[0]
    assert isinstance(arg, TensorArg)
    return {
        "upstream": upstream,
        "store3": make_plan(3),
        "store5_runtime": make_plan(5),
        "store8_wide": make_plan(8, n_args=6, n_buckets=5),
        "hand": hand,
        "hand_unlabelled_renamed": dataclasses.replace(hand, axis_labels=(), kernel_name="other"),
        "no_features": KernelPlan((), (), (), (SizeArg("n", "runtime_arg", index=None),)),
        # Values json writes its own way: a bool constant, a huge int, a str subclass, a bool static value.
        "odd_values": dataclasses.replace(
            upstream,
            axis_static_values=(("s9", True),),
            args=(dataclasses.replace(arg, size=(Const(True), Const(2**80), Axis(Name("x0")))), *upstream.args[1:]),
        ),
    }


BUDGETS = {
    "npu16": Budget("npu", 16 * 2**30, 0.25),
    "cuda80_int_ratio": Budget("cuda", 80 * 10**9, 1),
    "cuda80_float_ratio": Budget("cuda", 80 * 10**9, 1.0),
    "cpu_small_ratio": Budget("cpu", 123_456_789, 0.1),
}

#: name -> (plan hash, family hash, sha256 of the stored plan text)
GOLDEN_PLANS: dict[str, tuple[str, str, str]] = {
    "hand": (
        "4720f49c03e9ebdf6d0bf6f21fc78a496aa01c9d31860ee99382155030baf72c",
        "eaaa2178e0fb227bdbe2484a09864c65a65167ea08d4a8813e85506827f5b332",
        "2c968b3d6c5aaff9c3851e1a872e0baa82ae0b45fdb7a7e11ff33eee48ed7713",
    ),
    "hand_unlabelled_renamed": (
        "4720f49c03e9ebdf6d0bf6f21fc78a496aa01c9d31860ee99382155030baf72c",
        "eaaa2178e0fb227bdbe2484a09864c65a65167ea08d4a8813e85506827f5b332",
        "ebd9722e5fa51ff9dd6b00be9a16ad0b406ce8b83e0eed6a88aa327cbc2708bb",
    ),
    "no_features": (
        "92232056496a32ca8638a98c9ab18c32d3b0a6f2b498a10e63352a1c199b4514",
        "1491f2f6d588670bbd922d045b02fc032dd993b43a548fb247df9d9b5d26dc9e",
        "fa289001c08b4b693691537a12d59d3026b08f5c46065ffb1858b56e76bfd990",
    ),
    "odd_values": (
        "6dbf746896dfd277d814173a9d3904e2d72dc9bf3ef360057142f5501dde7c5b",
        "46c8e4eeec325208040976f93d44e76320e21a9c5b31f38ebb2f198c1507bda1",
        "4d838ce0e4a87a6845fd7b5b9338ba08e84b3be8f7f3892981a414ad54357857",
    ),
    "store3": (
        "6590eb9dc203e410ae7c1c4c56a485c8531b50d18eec678af4259dc91dfc903c",
        "dfa965a7fdcf5bdf028fd9ea6cdedc38e1e83901fa32a2216f0a6ad0796db306",
        "7c2b3543fd8f7f447773b2a3b46f70e3a78893f566540f01991f0bb024685ba5",
    ),
    "store5_runtime": (
        "dd32780e346639532563149fd7ca1f08c847ed73a883193415d0a1b04df44813",
        "a9460b5a34dda5a81354a910a35cbe1b14516375ccb330e6c09a32e00849c639",
        "67f76768511ae9fdff2ac1ef9eb48f811b2af2554061d6e2e2ec3fec1f5821bc",
    ),
    "store8_wide": (
        "5185ed1b8460776acb48f8595c5b1256175800d067b8d200a13ed25cbcce2046",
        "7fa4457a36e0143aa4b30c3843661a99e708e13707ac83e4a7508de13f1d458d",
        "876ed0b3f4dd2ec273b5d20a2ddc24a1a3f0d56f8aa06ba1d0af9a119e7d26f7",
    ),
    "upstream": (
        "7f9fbb907dd6b8a18db7834882b795607808c91b8f191a4049ff87d6d02d1c54",
        "9f5f1a7bf2754aa26d9ca246ceb6509acef367734ec16e85ee37ff4083547cec",
        "79a7ca3157e1b3580c84cf567ea8acb7aeaccbf95d74c8ef3f82abb45702c181",
    ),
}

#: (plan name, budget name) -> store key
GOLDEN_KEYS: dict[tuple[str, str], str] = {
    ("hand", "cpu_small_ratio"): "cec0ee8d939f2da38ceae7d8ea67c88c55ad975b3ac0924c14e4c72db24e56db",
    ("hand", "cuda80_float_ratio"): "c77b6e127e6a53d4cca79294837fa34244eed68662aa6de40011080d8a2e210a",
    ("hand", "cuda80_int_ratio"): "7dd97cbc7177794ddefee1c9eb0eaead88234d5a16a139ef7f009a8d8464a9ee",
    ("hand", "npu16"): "80618bfae428aaa20f72cb0b1dda7944553755f1849eee1e923b1ee226d2e33e",
    ("hand_unlabelled_renamed", "cpu_small_ratio"): "cec0ee8d939f2da38ceae7d8ea67c88c55ad975b3ac0924c14e4c72db24e56db",
    ("hand_unlabelled_renamed", "cuda80_float_ratio"): "c77b6e127e6a53d4cca79294837fa34244eed68662aa6de40011080d8a2e210a",
    ("hand_unlabelled_renamed", "cuda80_int_ratio"): "7dd97cbc7177794ddefee1c9eb0eaead88234d5a16a139ef7f009a8d8464a9ee",
    ("hand_unlabelled_renamed", "npu16"): "80618bfae428aaa20f72cb0b1dda7944553755f1849eee1e923b1ee226d2e33e",
    ("no_features", "cpu_small_ratio"): "3ecc9f51c5ea4f984343adbb32df45df0bb484e47e393bede6d6a096fb3f8274",
    ("no_features", "cuda80_float_ratio"): "6f5f502bcca02a8c80b19565f9f3594191c035f6b12f1297138fe37c386ecead",
    ("no_features", "cuda80_int_ratio"): "c5c470530ea9819625cb8afed2f88aaac80e69c6febc886d13898bc6de86e353",
    ("no_features", "npu16"): "1af1f012c1ab41a8a3ca067c2870ddecbc9e07fb6d3edb1d4638a411dd00e647",
    ("odd_values", "cpu_small_ratio"): "286f1932dbd32cdfa4951749b6838f8835a0112ebd7d7e42d237235d3ce40c27",
    ("odd_values", "cuda80_float_ratio"): "f81eda271ee7451b30e0561a5483d87b2bcef2a595792176ca9e33f8f32c25d9",
    ("odd_values", "cuda80_int_ratio"): "a1bdc777507d9d85f5605db8fa3ee7fb02e548532b29cf63fdd9273e1bfdc139",
    ("odd_values", "npu16"): "130bee39681e642d5a33c339dc3f11626c5e0d4e121fdfeeb82e57c5c1dc1aa3",
    ("store3", "cpu_small_ratio"): "3bc34ea299e7c7f2ac06fce979bb81f864242c141129260ab80c766ce631142b",
    ("store3", "cuda80_float_ratio"): "7b7400bf65b1fa43c334e947e8c371a88452df7f9fbcbd8f77b1254d78bce8a5",
    ("store3", "cuda80_int_ratio"): "dc6c85d25e974c7c42fe879b5d53b58bfb45232dd6dcddaf9286a1fc5c6a6f5a",
    ("store3", "npu16"): "e662902dcdcf3ff8365a2c1d2d7761282890d2943800a2ac0f83dcc8d9f6ae13",
    ("store5_runtime", "cpu_small_ratio"): "a54dd8f4d733963f856e07a242a97a118d5b1ea16d618a2aae76d6ea6688e49c",
    ("store5_runtime", "cuda80_float_ratio"): "f8ced21a9214bd72ba0f548564b13c6638621e1944f5a59fdb904f90247483c3",
    ("store5_runtime", "cuda80_int_ratio"): "ceae98e357d464d1d7dd4d98be2d255229965e2fd1aa7845a68aa5f4bf423c4d",
    ("store5_runtime", "npu16"): "8f9ce7b2fe8b2e8b02c0c17bce88950abc71982f01f87cbe8823a5e5a40b9852",
    ("store8_wide", "cpu_small_ratio"): "7de9f2d177de0a71d081d83f496308632739d21b2f590d19399a19255b1d5d0a",
    ("store8_wide", "cuda80_float_ratio"): "73bdca039bc1fc572fcfa451842479ef7ddfa176da61faaf695e3ae869227f7b",
    ("store8_wide", "cuda80_int_ratio"): "c26e9ce7968be6486cafcff370861cbcfecdaae717a488e50771b33bf889fcc9",
    ("store8_wide", "npu16"): "683692452d7669eabf7fcf9ff99754b2d9f52c8b076accc6f9c0f3ea785e5b33",
    ("upstream", "cpu_small_ratio"): "5757c3414043e421ee5c179f8dc8fa064be7cac72e56d749fd65398633ab7c20",
    ("upstream", "cuda80_float_ratio"): "de92c5f442ae9c45f429cfda4faf657f1d5c82dca8a2be735e45e01cbaf579eb",
    ("upstream", "cuda80_int_ratio"): "010b2883deb0ad66d49085f78b98f151a2c5300213b9825a19829637c133f5d7",
    ("upstream", "npu16"): "da97b213257881c26088264ac13bbb222af2fb91deec2e11534e9c0e809de871",
}

#: KeyParts whose fields have unusual types, hashed as json writes them
GOLDEN_PARTS: dict[str, str] = {
    "bool_ratio": "b1d120a9d7562e078ed3b863225538aed7d5d272bf0e88d1bb84c5b5442dfaa4",
    "float_memory": "2b57f21895f2d605d4dbda0671e95e0b127f734e1d491664a8e15ab77e4ac025",
    "huge_memory": "8f3c87f7ea3a81e24cb83d789d25cd57cb7b3a517b27eadd785b3ae522d03857",
    "plain": "75b02d54315058510eee68c3ea9e7d972a66927b5be615c35c4d551417780f84",
    "repeated_versions": "3418904753a9431301ad19730232ea3413ea10559d73f715051533e99bfce050",
    "str_subclass_device": "b4d9b291fdc7da8467b2161ab13489f11704092dc46212c59d873efe1cec5cf2",
}


def _odd_parts() -> dict[str, KeyParts]:
    base = KeyParts("p" * 64, "f\u00e9", "npu", 2**34, 0.25, 5, 3, VERSIONS)
    return {
        "plain": base,
        "bool_ratio": dataclasses.replace(base, ratio=True),
        "float_memory": dataclasses.replace(base, total_memory=1.5e10),  # type: ignore[arg-type]
        "str_subclass_device": dataclasses.replace(base, device_kind=Name("cu\"da")),
        "huge_memory": dataclasses.replace(base, total_memory=2**70),
        "repeated_versions": dataclasses.replace(base, versions=(("torch", "1"), ("a", "2"), ("torch", "3"))),
    }


def _computed() -> tuple[dict[str, tuple[str, str, str]], dict[tuple[str, str], str], dict[str, str]]:
    plans_out, keys_out = {}, {}
    for name, plan in _plans().items():
        text = canonical_json(plan.to_payload())
        plans_out[name] = (*plan_hashes(plan), hashlib.sha256(text.encode()).hexdigest())
        assert plans_out[name][0] == plan_hashes(plan)[0]
        for budget_name, budget in BUDGETS.items():
            keys_out[name, budget_name] = build_key(plan, budget)[0]
    parts_out = {name: parts.digest() for name, parts in _odd_parts().items()}
    return plans_out, keys_out, parts_out


@pytest.fixture(autouse=True)
def fixed_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key, "library_versions", lambda: VERSIONS)


def test_plan_hashes_and_plan_texts_are_unchanged() -> None:
    assert _computed()[0] == GOLDEN_PLANS


def test_keys_are_unchanged() -> None:
    assert _computed()[1] == GOLDEN_KEYS


def test_key_parts_digests_are_unchanged() -> None:
    assert _computed()[2] == GOLDEN_PARTS


def test_a_key_is_the_digest_of_its_parts_and_independent_of_display_fields() -> None:
    plans = _plans()
    for budget in BUDGETS.values():
        k, parts = build_key(plans["hand"], budget)
        assert k == parts.digest() and parts.versions == VERSIONS
        assert build_key(plans["hand_unlabelled_renamed"], budget)[0] == k
    # 1 == 1.0, but the budgets differ above 2**53 bytes (``Budget``): the key tells them apart.
    assert build_key(plans["hand"], BUDGETS["cuda80_int_ratio"])[0] != build_key(plans["hand"],
                                                                                 BUDGETS["cuda80_float_ratio"])[0]


if __name__ == "__main__":  # print the tables above from the code as it is
    import pprint
    import sys

    key.library_versions = lambda: VERSIONS  # type: ignore[assignment]
    for table in _computed():
        pprint.pprint(table, width=140, stream=sys.stdout)
