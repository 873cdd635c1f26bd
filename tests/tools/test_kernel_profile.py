"""dev.kernel_profile (tools/dev): its CPU rehearsal (Triton's interpreter, toy sizes) and its report."""

import json

from dev import kernel_profile


def test_the_cpu_rehearsal_profiles_each_case_of_a_label_and_writes_after_each(tmp_path):
    results = kernel_profile.run("cpu", tmp_path, steps=1, labels=("linear",))
    wanted = [(label, config) for label, _, config in kernel_profile.CASES if label == "linear"]
    assert [(case["label"], case["config"]) for case in results["cases"]] == wanted
    assert all("error" not in case and case["wall_ms"] > 0 for case in results["cases"])
    assert json.loads((tmp_path / "kernel_profile.json").read_text()) == results
    for _, config in wanted:
        assert f"## linear `{config or 'default'}`" in (tmp_path / "kernel_profile.md").read_text()


def test_a_case_builds_its_layer_with_the_sweeps_options_and_a_grid_variant_over_the_class_token_and_grid():
    performer = kernel_profile._module("performer", 65, 64, 2)
    assert performer.nb_features == 256  # the sweep's, not the variant's default
    window = kernel_profile._module("window2d:window=16,backend=torch", 4097, 64, 2)
    assert (window.window, window.backend, window.num_prefix_tokens) == (16, "torch", 1)
    assert tuple(window.grid_size) == (64, 64)


def test_the_report_gives_each_kernel_its_share_and_its_compiled_resources():
    case = {
        "label": "performer",
        "config": "favor=64:8::64",
        "wall_ms": 9.5,
        "kernels_ms": {"_query_backward_kernel": 3.0, "nvjet_sm90_gemm": 1.0},
        "resources": {"_query_backward_kernel": {"registers": 255, "spills": 28, "shared": 90112}},
    }
    failed = {"label": "hedgehog", "config": "", "error": "OutOfResources: shared memory"}
    text = kernel_profile.markdown(
        {"device": "cuda", "name": "H", "shape": (32, 4097, 384, 6), "cases": [case, failed]}
    )
    assert "| _query_backward_kernel | 3.000 | 75% | 255 | 28 | 90112 |" in text
    assert "| nvjet_sm90_gemm | 1.000 | 25% |  |  |  |" in text
    assert "wall 9.50 ms per step; kernels 4.00 ms" in text
    assert "## hedgehog `default`\n\nerror: OutOfResources: shared memory" in text


def test_every_fused_map_is_profiled_at_its_default_block_sizes_first():
    for name, (variant, _, _) in kernel_profile.FEATURES.items():
        configs = [config for label, _, config in kernel_profile.CASES if label == name]
        assert configs[0] == "" and len(configs) > 1, (variant, configs)


def test_the_fastest_layout_replaces_a_default_only_beyond_the_margin():
    def case(label, config, wall_ms=None):
        return {"label": label, "config": config, **({"wall_ms": wall_ms} if wall_ms is not None else {"error": "x"})}

    cases = [
        case("sdpa", "", 10.0),
        case("performer", "", 9.0),
        case("performer", "favor=32:8::64", 8.6),  # 4.4 % faster: beyond the 3 % margin
        case("performer", "favor=128:8::64", 8.5),  # the fastest
        case("hedgehog", "", 7.0),
        case("hedgehog", "hedgehog=32:8::64", 6.9),  # 1.4 % faster: within the margin
        case("linear", ""),  # the default failed: nothing to compare with
        case("linear", "elu=64:8", 3.0),
    ]
    assert kernel_profile.fastest_config(cases) == "favor=128:8::64"
    cases[5]["wall_ms"] = 6.5  # 7.1 % faster
    assert kernel_profile.fastest_config(cases) == "favor=128:8::64,hedgehog=32:8::64"
    assert kernel_profile.fastest_config(cases[:2]) == ""  # a default alone
