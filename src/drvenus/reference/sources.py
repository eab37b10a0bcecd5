"""The pinned official sources: one commit per repository, one SHA-256 per file drvenus reads.

A file is named by its repository folder (the name a local checkout has under
``DRVENUS_REFERENCE_DIR``) and its path inside the repository. To move a source to a newer
commit, change ``commit`` and every hash together, after reading what changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """One official repository at one commit, and the files of it drvenus reads."""

    name: str  # the folder of a local checkout, e.g. "DR-Venus"
    repo: str  # "owner/name" on GitHub
    commit: str  # the full 40-hex commit
    files: Mapping[str, str] = field(default_factory=dict)  # path -> sha256 hex
    licence: str = ""
    what: str = ""  # what drvenus reads from it, in a few words

    @property
    def short(self) -> str:
        return f"{self.name} @{self.commit[:7]}"


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="DR-Venus",
            repo="inclusionAI/DR-Venus",
            commit="60131410d24808765c8f711bd12497c7781c90b2",
            licence="Apache-2.0",
            what="inference and RL prompts, notices, tool texts",
            files={
                "Inference/run_demo.py":
                    "ee1da094a8f12c9aceb70827f234b43b05ace2f5bc827bb7e298eaef09186e1c",
                "Inference/tool_server/tool_prompt.py":
                    "e3168ec5a98c5646f676aa05165508665453c89fa35606b538327fba030a19cf",
                "Inference/tool_server/tool_visit.py":
                    "45c1f83b09b26e20dbc3659ea36331d3f4e8b46c0f1599c7ea8d58004e4b0258",
                "Inference/tool_server/tool_search.py":
                    "253df3540478c4feb2a73bbbc129bdaef562a018a5f1b01101eb5a1f5822836c",
                "Inference/tool_server/execute_tools.py":
                    "346ef6c38cf2fd303d06ba75622d0886098c5b4ad8f3c37d41216c609fe091ad",
                "RL/tool_server/tool_prompt.py":
                    "618d3cf4773907f2072a8573a926e1337391a6bf9664059da3acf3620e7fba10",
                "RL/tool_server/tool_visit.py":
                    "ec6063af392bbb4b91c73ef1dc390a8297cfe5a2a9be045ef9e3d4352218754a",
                "RL/tool_server/tool_search.py":
                    "3419417def9d90306252a25ec5abe6c6ee3893859be3b390320a9814e1eda4a9",
                "RL/tool_server/execute_tools.py":
                    "289afc8111e491eb2cf0c225a0fbb547247002ccb1f44157e29a645aef5b7d69",
                "RL/scrl/llm_agent/dr_agent_loop.py":
                    "b54588e3f6f9eb717e5decd3773ae87b6078f3f102294d89ad0ee7c3611dc443",
                "RL/scrl/llm_agent/generation.py":
                    "7e888cc69b6e31fde2dbe2dfa76d42c6c8724f79b7e22735d5269b8670686187",
                "RL/verl/utils/reward_score/llm_judge.py":
                    "3c9fe4d6d9e094b5af34419f1565c16ebf545349e6cb97c50e6af32156f5c679",
            },
        ),
        Source(
            name="simple-evals",
            repo="openai/simple-evals",
            commit="ee3b0318d8d1d9d72755a4120879be65f7c07e9e",
            licence="MIT",
            what="the BrowseComp grader template and its parsing; the grader's sampling",
            files={
                "browsecomp_eval.py":
                    "0bfb33cfdf5fa0e0d7da48068cc86c5a22acc755979be4a2b46f8a821cc44b74",
                "simple_evals.py":
                    "30508400525d3b1d91e2803713a8c2c3a98961263f0c3db6287c8414efd854ce",
                "sampler/chat_completion_sampler.py":
                    "d9d7568ad5b04379342b7f269a6028c6945c518bc8baa56969aad035afc8d435",
            },
        ),
        Source(
            name="xbench-evals",
            repo="xbench-ai/xbench-evals",
            commit="17c562192cc7e62215bfb98b65e9f8806fb95504",
            licence="MIT",
            what="the xbench judge prompt, its parsing and its judge call",
            files={
                "eval_grader.py":
                    "4dc9aa00358be01397df9f48da5a96ee87c56401973f57cb07f16ea7468ef497",
                "language_models.py":
                    "5237fdab20f0129e93d5f632ba79738bde7aa86b563e1a5fc35fa29a7dab60e8",
            },
        ),
        Source(
            name="hle",
            repo="centerforaisafety/hle",
            commit="87c92ead95bdd49d0598a3e16e926932bb0d12cc",
            licence="MIT",
            what="the HLE judge prompt, its structured verdict and its sampling",
            files={
                "hle_eval/run_judge_results.py":
                    "a796e74d6e58beab3bd88f46182f599443a102308b2d1c7e0b4b22f578468446",
            },
        ),
    )
}


def source(name: str) -> Source:
    """The pinned source called ``name`` (its checkout folder name, case as written)."""
    try:
        return SOURCES[name]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise KeyError(f"no reference source {name!r} (known: {known})") from None
