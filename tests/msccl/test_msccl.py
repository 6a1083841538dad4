"""MSCCL interop (ringcoll.msccl): public MSCCL-IR algorithms load, pass the simulator's data
check and match torch's built-ins on gloo; malformed XML is refused naming element and rule
with nothing registered; ringcoll's schedules export to MSCCL-IR and come back the same."""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

import ringcoll
import ringcoll.msccl as msccl
from ringcoll.schedules import registry
from ringcoll.msccl import MscclError
from ringcoll.msccl.ir import OPCODES, load_program, read_text
from ringcoll.msccl.to_schedule import compile_program
from ringcoll.schedules.registry import builder_of
from ringcoll.selection import choose

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "msccl")
#: public XMLs: file -> (collective, ranks, bitwise identical across ranks)
PUBLIC = {
    "ag_hier_4_Simple": ("all_gather", 4, True),
    "ar_hier_12_Simple": ("all_reduce", 4, True),
    "a2a2ll": ("all_to_all", 8, None),
    "ag-1k-512k": ("all_gather", 8, True),
    "r48ll": ("all_reduce", 8, True),
    "ap-1pass": ("all_reduce", 8, False),
    "allgather-allpairs-16n-16tb": ("all_gather", 16, True),
    "allreduce-allpairs-16n-16tb": ("all_reduce", 16, False),
}


def path(stem: str) -> str:
    return os.path.join(DATA, stem + ".xml.gz")


@pytest.fixture
def loaded_names():
    """Names a test loads, unloaded after it (other tests walk every registered algorithm)."""
    names = []
    yield names
    for name in names:
        if (name in ringcoll.algorithms().get("all_reduce", []) or any(name == k[1] for k in msccl.loaded())):
            msccl.unload(name)


def registered() -> dict:
    return {coll: list(names) for coll, names in ringcoll.algorithms().items()}


@pytest.mark.parametrize("stem", sorted(PUBLIC))
def test_public_xml_loads_and_passes_the_data_check(stem, loaded_names):
    collective, world, identical = PUBLIC[stem]
    if identical is False:
        before = registered()
        with pytest.raises(MscclError, match="not bitwise identical across ranks"):
            msccl.load(path(stem))
        assert registered() == before
    name = msccl.load(path(stem), deterministic=identical is not False)
    loaded_names.append(name)
    assert name == f"msccl:{stem}" and name in ringcoll.algorithms(collective)
    info = msccl.loaded()[(collective, name)]
    assert info.program.ngpus == world and info.deterministic is identical
    # sizes 0, 1, below the world, not a multiple of the chunking: padded, exact
    for numel in (0, 1, world - 1, 3 * world + 1, info.program.nchunksperloop * 2 + 3):
        ringcoll.simulate(builder_of(collective), name, world=world, numel=numel, check=True, record=False)


def test_the_msccl_ring_imports_to_ringcolls_ring(loaded_names):
    name = msccl.load(msccl.export("all_reduce", "ring", 8), name="ring8")
    loaded_names.append(name)
    compiled = msccl.loaded()[("all_reduce", name)].compiled
    assert (compiled.nsteps, compiled.messages) == (14, 112)
    # the public 8-rank ring (4 channels per ring, 8 chunks per rank): the same 14 steps
    public = msccl.load(path("r48ll"))
    loaded_names.append(public)
    assert msccl.loaded()[("all_reduce", public)].compiled.nsteps == 14


def test_a_loaded_algorithm_runs_only_at_its_world_and_auto_never_picks_it(loaded_names, tmp_path, monkeypatch):
    name = msccl.load(path("ar_hier_12_Simple"))
    loaded_names.append(name)
    # even a tuning table that names it for every size leaves auto to the others
    table = tmp_path / "tuning.csv"
    table.write_text(f"collective,nranks,min_bytes,max_bytes,algorithm\nall_reduce,4,0,1099511627776,{name}\n")
    monkeypatch.setenv("RINGCOLL_TUNING", str(table))
    with pytest.raises(ValueError, match=r"runs at world size 4 only, got a group of 5 ranks"):
        ringcoll.simulate("all_reduce", name, world=5, numel=40)
    for nbytes in (8, 1 << 10, 1 << 20, 1 << 26):
        assert choose("all_reduce", "auto", nbytes, 4)[0] != name
    assert choose("all_reduce", name, 1 << 20, 4) == (name, "requested")


def test_loading_again_is_idempotent_and_another_program_under_a_name_is_refused(loaded_names):
    name = msccl.load(path("ag_hier_4_Simple"))
    loaded_names.append(name)
    assert msccl.load(path("ag_hier_4_Simple")) == name
    with pytest.raises(ValueError, match="already registered"):
        msccl.load(path("ag-1k-512k"), name=name)
    with pytest.raises(ValueError, match="already registered"):
        msccl.load(path("ar_hier_12_Simple"), name="ring")       # a built-in's name


# -- malformed XML: each refused naming the element and the rule, nothing registered ---------

def ring_xml(world: int = 3) -> str:
    return msccl.export("all_gather", "ring", world)


def refused(text: str, *patterns: str) -> str:
    before = registered()
    with pytest.raises(MscclError) as error:
        msccl.load(text, name="broken")
    assert registered() == before, "a refused program left something registered"
    for pattern in patterns:
        assert re.search(pattern, str(error.value)), f"{pattern!r} not in {error.value}"
    return str(error.value)


PAIR = """<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="1" outofplace="1" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>"""


def test_the_well_formed_pair_loads(loaded_names):
    loaded_names.append(msccl.load(PAIR, name="pair"))


def test_a_missing_receive_is_refused():
    cut = PAIR.replace("""      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>\n""", "")
    assert cut != PAIR
    refused(cut, r"<gpu id=0> <tb id=0> <step s=0 type='s'>", "missing receive", "rank 0 to rank 1")


def test_a_dependency_cycle_is_refused():
    # rank 0 receives from 1 then sends to 1; rank 1 does the same: each waits on the other
    text = PAIR.replace('type="s" srcbuf="o" srcoff="0"', 'type="TMP"').replace(
        'type="r" srcbuf="o" srcoff="1"', 'type="s" srcbuf="o" srcoff="0"').replace('type="TMP"', 'type="r" srcbuf="o" srcoff="1"')
    text = text.replace('type="s" srcbuf="o" srcoff="1"', 'type="TMP"').replace(
        'type="r" srcbuf="o" srcoff="0"', 'type="s" srcbuf="o" srcoff="1"').replace('type="TMP"', 'type="r" srcbuf="o" srcoff="0"')
    assert text.count('type="r"') == 2 and text.index('type="r"') < text.index('type="s"')
    refused(text, r"<gpu id=\d> <tb id=0> <step s=\d type='[rs]'>", "dependency cycle")


#: every attribute MSCCL's executor reads (msccl_parser.cc), by element: (element's first tag
#: text in PAIR, attribute, how the error names the element)
REQUIRED = [("<algo ", a, "<algo>") for a in ("coll", "ngpus", "nchunksperloop", "nchannels", "proto", "inplace",
                                              "outofplace", "minBytes", "maxBytes")] + \
           [('<gpu id="0"', a, "<gpu id=0>") for a in ("i_chunks", "o_chunks", "s_chunks")] + \
           [('<tb id="0" send="1"', a, "<gpu id=0> <tb id=0>") for a in ("send", "recv", "chan")] + \
           [('<step s="1" type="r" srcbuf="o" srcoff="1"', a, r"<gpu id=0> <tb id=0> <step s=1 type='r'>")
            for a in ("srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")]


@pytest.mark.parametrize("tag, attribute, where", REQUIRED, ids=[f"{t.split()[0][1:]}-{a}" for t, a, _ in REQUIRED])
def test_a_missing_required_attribute_is_refused_naming_element_and_attribute(tag, attribute, where):
    start = PAIR.index(tag)
    end = PAIR.index(">", start)
    element = PAIR[start:end]
    cut = re.sub(rf' {attribute}="[^"]*"', "", element, count=1)
    assert cut != element, (tag, attribute)
    message = refused(PAIR[:start] + cut + PAIR[end:], re.escape(where), f"'{attribute}' is required")
    assert "given:" in message, message          # what the element does have


def test_a_step_without_cnt_is_refused_not_read_as_one_chunk():
    text = PAIR.replace('type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1"',
                        'type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1"')
    assert text != PAIR
    message = refused(text, r"<gpu id=0> <tb id=0> <step s=1 type='r'>", "'cnt' is required and missing")
    assert "dstoff='1'" in message, message


def test_a_count_msccl_cannot_run_is_refused():
    # the executor's MSCCL_MAX_COUNT: a step moves fewer than 72 chunks
    bad = PAIR.replace('dstoff="0" cnt="1"', 'dstoff="0" cnt="72"', 1)
    assert bad != PAIR
    refused(bad, r"<gpu id=0> <tb id=0> <step s=0 type='s'>", "cnt must be less than 72", "got 72")


def test_a_chunk_out_of_range_is_refused():
    bad = PAIR.replace('type="s" srcbuf="o" srcoff="0"', 'type="s" srcbuf="o" srcoff="2"', 1)
    assert bad != PAIR
    refused(bad, r"<gpu id=0> <tb id=0> <step s=0 type='s'>", "chunk out of range", "srcoff=2",
            "o_chunks")


def test_a_wrong_rank_count_is_refused():
    text = PAIR.replace('ngpus="2"', 'ngpus="3"', 1)
    refused(text, "<algo>", "wrong rank count", "ngpus=3", "2 <gpu> elements")


def test_a_wrong_data_result_is_refused_naming_rank_and_element():
    # a program that moves chunks but never reduces: the simulator's check names the element
    text = ring_xml(3).replace('coll="allgather"', 'coll="allreduce"')
    text = re.sub(r'i_chunks="\d+" o_chunks="\d+"', 'i_chunks="6" o_chunks="6"', text)
    before = registered()
    with pytest.raises(AssertionError, match=r"rank \d.*element \d+ is"):
        msccl.load(text, name="mock")
    assert registered() == before


# -- export ---------------------------------------------------------------------------------

EXPORTED = [("all_reduce", a) for a in ("ring", "recursive_doubling", "rabenseifner", "double_binary_tree",
                                        "swing_latency", "swing_bandwidth", "bine")] + \
           [("all_gather", "ring"), ("all_gather", "bruck")]


@pytest.mark.parametrize("collective, algorithm", EXPORTED)
@pytest.mark.parametrize("world", [5, 8])
def test_export_load_simulate_is_correct_and_costs_the_same(collective, algorithm, world, tmp_path, loaded_names):
    if (algorithm, world) == ("bruck", 5):
        pytest.xfail("Bruck's final rotation at p=5 comes back one step later (known, see report)")
    target = tmp_path / f"{algorithm}.xml"
    text = msccl.export(collective, algorithm, world, str(target))
    assert target.read_text() == text
    name = msccl.load(str(target), name=f"x:{collective}:{algorithm}:{world}")
    loaded_names.append(name)
    numel = msccl.loaded()[(collective, name)].program.nchunksperloop * 3
    ours = ringcoll.simulate(builder_of(collective), algorithm, world=world, numel=numel)
    back = ringcoll.simulate(builder_of(collective), name, world=world, numel=numel)
    assert back.stats.time == ours.stats.time


def test_export_with_channels_splits_every_message(loaded_names):
    one, two = load_program(msccl.export("all_reduce", "ring", 4)), load_program(msccl.export("all_reduce", "ring", 4, channels=2))
    assert two.nchunksperloop == 2 * one.nchunksperloop and two.nchannels == 2
    name = msccl.load(msccl.export("all_reduce", "ring", 4, channels=2), name="ring4x2")
    loaded_names.append(name)
    assert msccl.loaded()[("all_reduce", name)].compiled.messages == 2 * 24


def test_export_refuses_bad_arguments():
    with pytest.raises(ValueError, match="collective must be one of"):
        msccl.export("broadcast", "ring", 4)
    with pytest.raises(ValueError, match="world must be an int >= 2"):
        msccl.export("all_reduce", "ring", 1)
    with pytest.raises(ValueError, match="channels must be an int in"):
        msccl.export("all_reduce", "ring", 4, channels=0)
    with pytest.raises(ValueError, match="runs at most 64 per threadblock"):
        msccl.export("all_reduce", "ring", 40)


# -- a real gloo group ----------------------------------------------------------------------

def run_loaded(files, numels):
    """On each rank: load the XMLs, run each against torch's built-in, unload."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for file in files:
        name = msccl.load(file)
        program = msccl.loaded()
        collective = next(k[0] for k in program if k[1] == name)
        try:
            for numel in numels:
                base = torch.arange(numel, dtype=torch.int64) % 7 + 1 + 3 * rank
                if collective == "all_reduce":
                    got, want = base.clone(), base.clone()
                    ringcoll.all_reduce(got, algorithm=name)
                    dist.all_reduce(want)
                elif collective == "all_gather":
                    got, want = torch.zeros(world * numel, dtype=torch.int64), torch.zeros(world * numel, dtype=torch.int64)
                    ringcoll.all_gather_into_tensor(got, base, algorithm=name)
                    dist.all_gather_into_tensor(want, base)
                else:
                    data = torch.arange(world * numel, dtype=torch.int64) + 100 * rank
                    got, want = torch.zeros_like(data), torch.zeros_like(data)
                    ringcoll.all_to_all_single(got, data, algorithm=name)
                    dist.all_to_all_single(want, data)
                out.append((file, numel, torch.equal(got, want), got.tolist()))
        finally:
            msccl.unload(name)
    return out


def test_public_4_rank_xmls_match_the_builtins_on_gloo(clusters):
    files = [path("ag_hier_4_Simple"), path("ar_hier_12_Simple")]
    answers = clusters(4).run(run_loaded, files, [0, 1, 3, 16, 24 * 3 + 5])
    for rank, rows in enumerate(answers):
        for file, numel, same, _ in rows:
            assert same, f"rank {rank}: {os.path.basename(file)} at {numel} elements differs from torch's"
    for rows in zip(*answers):          # bitwise identical on every rank
        assert all(r[3] == rows[0][3] for r in rows if "ag_" in r[0] or "ar_" in r[0])


def test_public_8_rank_xmls_match_the_builtins_on_gloo(clusters):
    """The 8-rank allreduce (r48ll), allgather (ag-1k-512k) and alltoall (a2a2ll) on 8 real
    gloo ranks against torch, at sizes below, at and off their chunking; the replicated
    results bitwise identical on every rank."""
    files = [path("r48ll"), path("ag-1k-512k"), path("a2a2ll")]
    answers = clusters(8).run(run_loaded, files, [0, 1, 7, 8 * 6 + 5])
    for rank, rows in enumerate(answers):
        assert len(rows) == 3 * 4
        for file, numel, same, _ in rows:
            assert same, f"rank {rank}: {os.path.basename(file)} at {numel} elements differs from torch's"
    for rows in zip(*answers):
        if "a2a" not in rows[0][0]:
            assert all(r[3] == rows[0][3] for r in rows), rows[0][:2]


def test_exported_alltoall_matches_the_builtin_on_gloo(clusters, tmp_path):
    target = tmp_path / "a2a4.xml"
    msccl.export("all_to_all", "pairwise", 4, str(target))
    for rank, rows in enumerate(clusters(4).run(run_loaded, [str(target)], [0, 1, 5])):
        for _file, numel, same, _ in rows:
            assert same, f"rank {rank}: exported pairwise all_to_all at {numel} elements per peer"


def test_public_8_rank_alltoall_and_16_rank_xmls_in_the_simulator(loaded_names):
    for stem in ("a2a2ll", "allgather-allpairs-16n-16tb"):
        name = msccl.load(path(stem))
        loaded_names.append(name)
        collective, world, _ = PUBLIC[stem]
        sim = ringcoll.simulate(builder_of(collective), name, world=world, numel=world * 17, check=True)
        assert sim.stats.time > 0


# -- python -m ringcoll.msccl check ---------------------------------------------------------

def test_check_prints_what_the_program_is_and_costs(capsys):
    from ringcoll.msccl.__main__ import main

    before = registered()
    assert main(["check", path("r48ll"), "--bytes", "64K"]) == 0
    out = capsys.readouterr().out
    for line in ("collective:     all_reduce", "ranks:          8", "steps:          14", "messages:       896",
                 "bytes per rank:", "deterministic:  yes", "simulated time:", "first wrong:    none"):
        assert line in out, out
    assert registered() == before


def test_check_names_the_first_wrong_element_and_a_malformed_file(tmp_path, capsys):
    from ringcoll.msccl.__main__ import main

    mock = ring_xml(3).replace('coll="allgather"', 'coll="allreduce"')
    mock = re.sub(r'i_chunks="\d+" o_chunks="\d+"', 'i_chunks="6" o_chunks="6"', mock)
    (tmp_path / "mock.xml").write_text(mock)
    assert main(["check", str(tmp_path / "mock.xml")]) == 1
    assert re.search(r"first wrong: +all_reduce/.* rank \d.*element \d+ is", capsys.readouterr().out)
    (tmp_path / "bad.xml").write_text(PAIR.replace('ngpus="2"', 'ngpus="3"'))
    assert main(["check", str(tmp_path / "bad.xml")]) == 2
    assert "wrong rank count" in capsys.readouterr().err


# -- ringcoll-bench --msccl -----------------------------------------------------------------

def test_bench_runs_an_msccl_xml_as_a_contestant(tmp_path, capsys):
    """``ringcoll-bench --msccl FILE.xml``: its collective by default, a row against the
    built-in, checked (its own ranks: the shared clusters must not keep the algorithm)."""
    import json
    from ringcoll.bench import cli

    out = tmp_path / "results"
    file = path("ar_hier_12_Simple")
    try:
        status = cli.main(["--msccl", file, "--np", "4", "--algorithms", "ring", "-b", "96", "-e", "1K",
                           "-n", "2", "-w", "0", "--no-plot", "--out", str(out)])
        printed = capsys.readouterr().out
        assert status == 0, printed
        (json_name,) = [f for f in os.listdir(out) if f.endswith(".json")]
        rows = json.loads((out / json_name).read_text())["rows"]
        mine = [r for r in rows if r["algorithm"] == "msccl:ar_hier_12_Simple"]
        assert mine and all(r["collective"] == "all_reduce" and r["wrong"] == 0 and r["error"] is None
                            for r in mine), rows
        assert "msccl:ar_hier_12_Simple" in printed
        with pytest.raises(SystemExit, match=r"--msccl .*runs at 4 ranks, the benchmark at 2"):
            cli.main(["--msccl", file, "--np", "2", "-b", "1K", "-e", "1K", "--no-plot", "--out", str(out)])
    finally:
        if any(k[1] == "msccl:ar_hier_12_Simple" for k in msccl.loaded()):
            msccl.unload("msccl:ar_hier_12_Simple")


def test_study_sweep_takes_a_loaded_program_at_its_own_world(loaded_names, tmp_path):
    """``ringcoll-study sweep --msccl FILE`` loads the program and sweeps it beside ringcoll's
    own at its world size only (other worlds skip it instead of failing)."""
    from ringcoll.sim.cli import main

    target = tmp_path / "ring4.xml"
    msccl.export("all_reduce", "ring", 4, str(target))
    out = tmp_path / "study"
    assert main(["sweep", "--worlds", "3,4", "-b", "1K", "-e", "4K", "--msccl", str(target),
                 "--algorithms", "ring,recursive_doubling", "--out", str(out)]) == 0
    loaded_names.append("msccl:ring4")
    rows = (out / "study_all_reduce.csv").read_text().splitlines()
    ours = [row for row in rows if row.split(",")[1] == "msccl:ring4"]
    assert ours and all(row.split(",")[2] == "4" for row in ours), ours
    ring = {row.split(",")[3]: row for row in rows if row.split(",")[1:3] == ["ring", "4"]}
    for row in ours:        # the exported ring costs what ringcoll's ring costs
        fields = row.split(",")
        assert fields[4] == ring[fields[3]].split(",")[4], (row, ring[fields[3]])


# -- buffers reused along a chain (MSCCL's buffered sends) -----------------------------------

#: hand-written 3-rank ring allgathers that receive every chunk into one scratch slot s[0],
#: copy it out, forward it from s[0] and receive the next chunk into s[0]: one threadblock
#: per rank, and one with separate send/receive threadblocks ordered by depid/deps
SCRATCH_RING = ["ring_allgather_3_scratch", "ring_allgather_3_scratch_deps"]


def xml_path(stem: str) -> str:
    return os.path.join(DATA, stem + ".xml")


def scratch_ring(copy_outs) -> str:
    """The one-threadblock scratch ring with each rank's two copy-outs into ``copy_outs(rank)``
    (output blocks): a well-formed program that computes the wrong all_gather when they are
    not (left, the one before it)."""
    text = open(xml_path("ring_allgather_3_scratch")).read()
    gpus = text.split('<gpu id=')
    for rank in range(3):
        first, second = copy_outs(rank)
        part = gpus[rank + 1]
        part = re.sub(r'(<step s="3" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff=")\d', rf"\g<1>{first}", part)
        part = re.sub(r'(<step s="6" type="cpy" srcbuf="s" srcoff="0" dstbuf="o" dstoff=")\d', rf"\g<1>{second}", part)
        gpus[rank + 1] = part
    return '<gpu id='.join(gpus)


@pytest.mark.parametrize("stem", SCRATCH_RING)
def test_a_ring_that_reuses_one_scratch_slot_loads_and_gathers_exactly(stem, loaded_names):
    name = msccl.load(xml_path(stem))
    loaded_names.append(name)
    compiled = msccl.loaded()[("all_gather", name)].compiled
    # two rounds of 3 messages; the second forwards a copy of s[0] taken before it receives into it
    assert (compiled.alpha, compiled.messages, compiled.snapshots) == (2, 6, 3)
    for numel in (3, 6, 7, 3 * 5 + 1):
        block = -(-numel // 3)
        inputs = [(torch.empty(3 * block, dtype=torch.int64), torch.arange(block, dtype=torch.int64) + 10 * rank + 1)
                  for rank in range(3)]
        sim = ringcoll.simulate("all_gather_into_tensor", name, world=3, inputs=inputs, check=False)
        want = torch.cat([inputs[rank][1] for rank in range(3)])
        for rank, out in enumerate(sim.outputs):
            got = out if isinstance(out, torch.Tensor) else torch.cat(list(out))
            assert torch.equal(got, want), f"rank {rank} at {numel} elements: got {got.tolist()}, want {want.tolist()}"


def test_the_scratch_reusing_rings_match_the_builtin_on_gloo(clusters):
    files = [xml_path(stem) for stem in SCRATCH_RING]
    for rank, rows in enumerate(clusters(3).run(run_loaded, files, [0, 1, 2, 3 * 4 + 1])):
        assert len(rows) == 2 * 4
        for file, numel, same, got in rows:
            assert same, f"rank {rank}: {os.path.basename(file)} at {numel} elements per rank gives {got}"


def test_a_scratch_ring_that_skips_a_block_is_a_wrong_result_never_written():
    # every rank copies both received chunks into the block of its left neighbour: the block
    # of its right neighbour is never written (rank 0: block 1, elements 2 and 3 at 6 elements)
    text = scratch_ring(lambda rank: ((rank - 1) % 3, (rank - 1) % 3))
    before = registered()
    with pytest.raises(AssertionError) as error:
        msccl.load(text, name="skips")
    assert registered() == before
    message = str(error.value)
    assert "cycle" not in message, message
    assert re.search(r"rank 0 output \(o chunk 1\): element 2 is never written, the definition gives 2\b", message), message


def test_a_scratch_ring_that_swaps_two_blocks_is_a_wrong_result_naming_the_value():
    # every rank copies the chunk of its left neighbour where the one before it belongs and back
    text = scratch_ring(lambda rank: ((rank + 1) % 3, (rank - 1) % 3))
    before = registered()
    with pytest.raises(AssertionError) as error:
        msccl.load(text, name="swaps")
    assert registered() == before
    message = str(error.value)
    assert "cycle" not in message, message
    # rank 0's block 1 holds rank 2's first element (1 + 2), the definition rank 1's (1 + 1)
    assert re.search(r"rank 0 output \(o chunk 1\): element 2 is 3, the definition gives 2\b", message), message


def test_check_reports_a_never_written_element_without_garbage(tmp_path, capsys):
    from ringcoll.msccl.__main__ import main

    (tmp_path / "skips.xml").write_text(scratch_ring(lambda rank: ((rank - 1) % 3, (rank - 1) % 3)))
    assert main(["check", str(tmp_path / "skips.xml")]) == 1
    out = capsys.readouterr().out
    assert re.search(r"first wrong: +.*rank 0 output \(o chunk 1\): element \d+ is never written, the definition gives \d+", out), out


def test_a_scratch_ring_that_copies_out_an_unwritten_slot_says_so_without_garbage():
    # the last copy-out reads s[1], which nothing writes: the element holds no value of the program's
    text = re.sub(r'(<step s="6" type="cpy" srcbuf="s" srcoff=")0', r"\g<1>1",
                  open(xml_path("ring_allgather_3_scratch")).read()).replace('s_chunks="1"', 's_chunks="2"')
    with pytest.raises(AssertionError) as error:
        msccl.load(text, name="unwritten")
    assert re.search(r"rank 0 output \(o chunk 1\): element 2 is only ever written from chunks nothing wrote "
                     r"\(uninitialised memory\), the definition gives 2\b", str(error.value)), str(error.value)


def test_a_send_then_a_receive_into_its_chunks_sends_what_they_held():
    # every rank sends o[0] to its right and receives its left's o[0] into o[0] (MSCCL: the
    # send took its copy first): a rotation, which all_reduce's check names with the value
    gpus = "".join(f'''<gpu id="{r}" i_chunks="1" o_chunks="1" s_chunks="0"><tb id="0" send="{(r + 1) % 3}" recv="{(r - 1) % 3}" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb></gpu>''' for r in range(3))
    text = ('<algo name="rotate" proto="Simple" nchannels="1" nchunksperloop="1" ngpus="3" coll="allreduce" '
            f'inplace="1" outofplace="0" minBytes="0" maxBytes="0">{gpus}</algo>')
    compiled = compile_program(load_program(text))
    assert (compiled.alpha, compiled.messages, compiled.snapshots) == (1, 3, 3)
    with pytest.raises(AssertionError) as error:
        msccl.load(text, name="rotate")
    # rank 0 holds rank 2's first element (1 + 2); the sum is 1 + 2 + 3
    assert re.search(r"rank 0 output \(o chunk 0\): element 0 is 3, the definition gives 6\b", str(error.value)), str(error.value)


# -- ringcoll's run against MSCCL's semantics, instruction by instruction --------------------

def msccl_semantics(program, inputs):
    """Each rank's buffers after MSCCL runs ``program``: threadblocks run their steps in order,
    a step waits for its depid's step and, if it receives, for a message on its connection;
    a send is buffered (it takes its chunks when issued). ``inputs[rank]``: the value of each
    input chunk. Buffers are dicts (buffer, chunk) -> value; never-written chunks are absent.
    A program that cannot finish raises (MSCCL deadlocks)."""
    from ringcoll.msccl.to_schedule import aliases

    n = program.ngpus
    memory, fifo = [], {}
    for rank in range(n):
        alias = aliases(program, rank)
        target, base = alias.get("i", ("i", 0))
        memory.append({(target, base + k): v for k, v in enumerate(inputs[rank])})

    def cells(rank, buf, off, cnt):
        target, base = aliases(program, rank).get(buf, (buf, 0))
        return [(target, base + off + k) for k in range(cnt)]

    def read(rank, buf, off, cnt):
        return [memory[rank].get(c) for c in cells(rank, buf, off, cnt)]

    def write(rank, buf, off, values):
        for c, v in zip(cells(rank, buf, off, len(values)), values):
            if v is None:
                memory[rank].pop(c, None)
            else:
                memory[rank][c] = v

    def add(a, b):
        return [None if x is None or y is None else x + y for x, y in zip(a, b)]

    done = {(g.id, tb.id): 0 for g in program.gpus for tb in g.tbs.values()}
    while True:
        moved = False
        for gpu in program.gpus:
            for tb in gpu.tbs.values():
                pc = done[(gpu.id, tb.id)]
                if pc == len(tb.steps):
                    continue
                ins = tb.steps[pc]
                if ins.depid >= 0 and done[(gpu.id, ins.depid)] <= ins.deps:
                    continue
                inbox = fifo.setdefault((tb.recv, gpu.id, tb.chan), [])
                if ins.receives and not inbox:
                    continue
                got = inbox.pop(0) if ins.receives else None
                r, op = gpu.id, ins.op
                src = read(r, ins.srcbuf, ins.srcoff, ins.cnt) if OPCODES[op][2] else None
                out = None
                if op == "s":
                    out = src
                elif op in ("r", "rcs"):
                    write(r, ins.dstbuf, ins.dstoff, got)
                    out = got
                elif op == "rrs":
                    out = add(got, src)
                elif op in ("rrc", "rrcs"):
                    out = add(got, src)
                    write(r, ins.dstbuf, ins.dstoff, out)
                elif op == "cpy":
                    write(r, ins.dstbuf, ins.dstoff, src)
                elif op == "re":
                    write(r, ins.dstbuf, ins.dstoff, add(read(r, ins.dstbuf, ins.dstoff, ins.cnt), src))
                if ins.sends:
                    fifo.setdefault((r, tb.send, tb.chan), []).append(list(out))
                done[(gpu.id, tb.id)] = pc + 1
                moved = True
        if all(done[(g.id, tb.id)] == len(tb.steps) for g in program.gpus for tb in g.tbs.values()):
            return memory
        assert moved, f"MSCCL deadlocks: {done}"


def compare_with_msccl(text: str, name: str):
    """Run ``text`` in the simulator at one element per chunk and compare every output
    element MSCCL's semantics define with it; the number of elements compared."""
    from ringcoll.msccl.program import cost_of, result_of, schedule_of
    from ringcoll.msccl.to_schedule import aliases

    program = load_program(text)
    compiled = compile_program(program)
    n, total, coll = program.ngpus, program.nchunksperloop, program.collective
    per = total if coll == "all_reduce" else total // n
    size = per if coll == "all_gather" else total
    data = [[1000 * (rank + 1) + k + 1 for k in range(size)] for rank in range(n)]
    out_numel = {"all_reduce": total, "all_gather": total, "all_to_all": total, "reduce_scatter": per}[coll]
    calls = [(torch.tensor(data[r]),) if coll == "all_reduce" else
             (torch.zeros(out_numel, dtype=torch.int64), torch.tensor(data[r])) for r in range(n)]
    registry.register(coll, name, cost_of(compiled), replace=True, world=n, auto=False)(schedule_of(compiled, name))
    try:
        sim = ringcoll.simulate(builder_of(coll), name, world=n, inputs=calls, check=False, record=False)
    finally:
        registry.unregister(coll, name)
    memory = msccl_semantics(program, data)
    compared = 0
    for rank in range(n):
        got = result_of(sim.outputs[rank]).tolist()
        target, base = aliases(program, rank).get("o", ("o", 0))
        for k in range(out_numel):
            want = memory[rank].get((target, base + k))
            if want is not None:
                assert got[k] == want, f"{name}: rank {rank} output element {k}: ringcoll {got[k]}, MSCCL {want}"
                compared += 1
    return compared


@pytest.mark.parametrize("stem", sorted(PUBLIC) + SCRATCH_RING)
def test_ringcolls_run_gives_what_msccl_gives(stem):
    text = read_text(path(stem) if stem in PUBLIC else xml_path(stem))
    assert compare_with_msccl(text, "semantics") > 0


@pytest.mark.parametrize("wrong", ["skips", "swaps"])
def test_a_wrong_program_gives_what_msccl_gives(wrong):
    outs = {"skips": lambda rank: ((rank - 1) % 3, (rank - 1) % 3), "swaps": lambda rank: ((rank + 1) % 3, (rank - 1) % 3)}
    assert compare_with_msccl(scratch_ring(outs[wrong]), wrong) > 0


@pytest.mark.parametrize("collective, algorithm", EXPORTED + [("all_to_all", "pairwise")])
def test_an_exported_schedule_runs_as_msccl_runs_it(collective, algorithm):
    assert compare_with_msccl(msccl.export(collective, algorithm, 5), "semantics") > 0
