"""The bibliography of the pages the code writes: each work once, and the ``## References`` section that a
generated results page ends with.

Every family page and results page of the site ends with its references (tests/test_docs.py checks it).
A page that a generator writes (``dpadmm reproduce``'s ``summary.md``, the comparison's ``table.md``) must
write that section itself, or the next regeneration drops it; and the generators share works (003 is on
five of them), so each entry lives here once and a generator names the keys it cites.

An entry is kept as the Markdown list item the pages print, line breaks included, rather than as fields
to format: the docs were written by hand with breaks a wrapping rule does not reproduce, and kept verbatim
a regenerated page is the same bytes as the page it replaces, and the copies of the same entries on the
hand-written family pages can be compared with these word for word (tests/test_references.py).

This module belongs to the run floor: it imports no family, and every family and ``benchmarks/`` may
import it.
"""

from __future__ import annotations

import re

# The works, each as "[key]" on a line of its own and then its list item as the pages print it. Keys: the
# project's numbers for the papers it reproduces (000-004), the first author and year for the others.
_BIBLIOGRAPHY = """\
[003]
- **003**: Minseok Ryu and Kibaek Kim. *Differentially Private Federated Learning via Inexact ADMM with
  Multiple Local Updates.* IEEE journal version; preprint arXiv:2202.09409, 2022.
  <https://arxiv.org/abs/2202.09409>
[000]
- **000**: Minseok Ryu and Kibaek Kim. *Differentially Private Federated Learning via Inexact ADMM.*
  Argonne National Laboratory, preprint: the conference version that 003 extends. The authors' code,
  which both papers cite: <https://github.com/APPFL/DPFL-IADMM-Classification>
[002]
- **002**: Tao Xu, Fanhua Shang, Yuanyuan Liu, Hongying Liu, Longjie Shen and Maoguo Gong.
  *Differentially Private ADMM Algorithms for Machine Learning.* IEEE Transactions on Information Forensics
  and Security, 2021. <https://ieeexplore.ieee.org/document/9540875>
[001]
- **001**: Yaochen Hu, Peng Liu, Linglong Kong and Di Niu. *Learning Privately over Distributed Features:
  An ADMM Sharing Approach.* Preprint arXiv:1907.07735, 2019. <https://arxiv.org/abs/1907.07735>
[004]
- **004**: Hanshen Xiao, Yu Ye and Srinivas Devadas. *Local Differential Privacy in Decentralized
  Optimization.* Preprint arXiv:1902.06101, 2019. <https://arxiv.org/abs/1902.06101>
[huang2019]
- Zonghao Huang, Rui Hu, Yuanxiong Guo, Eric Chan-Tin and Yanmin Gong. *DP-ADMM: ADMM-Based Distributed
  Learning with Differential Privacy.* IEEE Transactions on Information Forensics and Security 15,
  1002-1012, 2019 (003's and 000's baseline, OutP here). <https://arxiv.org/abs/1808.10101>
[hu2019]
- Yaochen Hu, Di Niu, Jianming Yang and Shengping Zhou. *FDML: A Collaborative Machine Learning
  Framework for Distributed Features.* KDD, 2019 (001's SGD baseline). <https://arxiv.org/abs/1812.06415>
[huang2015]
- Z. Huang, S. Mitra and N. Vaidya. *Differentially Private Distributed Optimization.* Proceedings of
  the 2015 International Conference on Distributed Computing and Networking (ICDCN), ACM, 2015 (004's
  baseline, noisy DGD here; 004's reference [45]).
[abadi2016]
- Martín Abadi, Andy Chu, Ian Goodfellow, H. Brendan McMahan, Ilya Mironov, Kunal Talwar and Li Zhang.
  *Deep Learning with Differential Privacy.* ACM CCS, 2016 (DP-SGD). <https://arxiv.org/abs/1607.00133>
[mcmahan2017]
- H. Brendan McMahan, Eider Moore, Daniel Ramage, Seth Hampson and Blaise Agüera y Arcas.
  *Communication-Efficient Learning of Deep Networks from Decentralized Data.* AISTATS, 2017 (FedAvg).
  <https://arxiv.org/abs/1602.05629>
[mcmahan2018]
- H. Brendan McMahan, Daniel Ramage, Kunal Talwar and Li Zhang. *Learning Differentially Private
  Recurrent Language Models.* ICLR, 2018 (DP-FedAvg). <https://arxiv.org/abs/1710.06963>
[yousefpour2021]
- Ashkan Yousefpour, Igor Shilov, Alexandre Sablayrolles, Davide Testuggine, Karthik Prasad, Mani Malek,
  John Nguyen, Sayan Ghosh, Akash Bharadwaj, Jessica Zhao, Graham Cormode and Ilya Mironov. *Opacus:
  User-Friendly Differential Privacy Library in PyTorch.* Preprint arXiv:2109.12298, 2021.
  <https://arxiv.org/abs/2109.12298>
[li2020]
- Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet Talwalkar and Virginia Smith.
  *Federated Optimization in Heterogeneous Networks.* MLSys, 2020 (FedProx).
  <https://arxiv.org/abs/1812.06127>
[hsu2019]
- Tzu-Ming Harry Hsu, Hang Qi and Matthew Brown. *Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification.* Preprint arXiv:1909.06335, 2019 (Dirichlet label
  skew). <https://arxiv.org/abs/1909.06335>
"""


def _entries(text: str) -> dict[str, str]:
    """key -> list item, from the "[key]" headed blocks of :data:`_BIBLIOGRAPHY`."""
    parts = re.split(r"^\[([\w-]+)\]\n", text, flags=re.M)
    if parts[0].strip():
        raise ValueError(f"text before the first [key]: {parts[0][:60]!r}")
    return {key: body.rstrip("\n") for key, body in zip(parts[1::2], parts[2::2], strict=True)}


ENTRIES: dict[str, str] = _entries(_BIBLIOGRAPHY)


def section(keys: tuple[str, ...] | list[str]) -> list[str]:
    """The lines of a page's ``## References`` section listing ``keys`` in that order, for a generator to
    append to its page's lines (joined with newlines: an entry spans several). An unknown key is an error
    here rather than a missing entry on a page nobody rereads."""
    unknown = [k for k in keys if k not in ENTRIES]
    if unknown or not keys:
        raise ValueError(f"references {unknown or 'none'} are not allowed; choose among "
                         f"{', '.join(ENTRIES)}")
    return ["## References", "", *(ENTRIES[k] for k in keys)]
