"""The text study's data: bytes of the Python 3.11.7 standard library, and passkey rows.

The corpus is the source of 72 modules of CPython 3.11.7's ``Lib/`` (64 to train on, 8
held out for evaluation), read from the interpreter's own ``stdlib`` directory: every
machine that runs the project's pinned Python has it offline. Each file is checked
against its SHA-256 below before use; another Python gives a ``ValueError`` naming the
file. The text is Python's, under the PSF License Agreement (``LICENSE.txt`` next to
the modules); the study reads it and stores only numbers.

Tokens are bytes (a vocabulary of 256). A *passkey* row hides ``# passkey: 48213`` at
some depth of a stretch of held-out code and ends with ``# passkey: `` and the same five
digits, which only a model that retrieves the line can predict.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import torch

__all__ = ["FILES", "VOCAB", "corpus", "train_batch", "eval_windows", "passkey_batch"]

VOCAB = 256
NEEDLE, END, DIGITS = b"\n# passkey: ", b"\n", 5  # the line: NEEDLE + digits + END

# (split, file of Lib/, sha256): CPython 3.11.7
# fmt: off
FILES = (
    ("train", "_collections_abc.py", "ec646ef7e27aae261adef3c57b9d18822c6526b3e9562dabb9f3cb4e6803066c"),  # noqa: E501
    ("train", "_pydecimal.py", "14cf1bf7ead78a0beb578f19ebc4ec82f542e0879f5b77d327f01abf74591586"),  # noqa: E501
    ("train", "_pyio.py", "f22f010af7d96fa7fc3b69e52ca2d832c9a8b83350cf36c38da39ba9a5040f72"),  # noqa: E501
    ("train", "_strptime.py", "065e6597af214f795d16c018fdfe60ec93ab1d2703bdb159e0576173a19a72f8"),  # noqa: E501
    ("train", "aifc.py", "e027e8a33567890ad7f84fea3be423cc0f6e49a33a31bbf279c2d0f64b6f8345"),  # noqa: E501
    ("train", "argparse.py", "dc1eba8adfdf615986421f981337458ba1072d3e718a0f76e3224940fd74118b"),  # noqa: E501
    ("train", "ast.py", "c513073798bdbf3cdef09327d0d2d381a53213a13a4ba3f02729695327539406"),  # noqa: E501
    ("train", "bdb.py", "314d8bf11b4824d47471ad25dab64bda895e39673fb744e88e7f622a3dd374f2"),  # noqa: E501
    ("train", "calendar.py", "b3b140864fd122a575ffcc9342b824fbe4f8a38fdf3f4fcd964f26e52725358f"),  # noqa: E501
    ("train", "cgi.py", "f132666784c29a3e275f50596f87bb8abc388a94fcdb70be130000e01a9a6b78"),  # noqa: E501
    ("train", "codecs.py", "f16a81d14e7f73931ecf9f9f2e17c10bc0ca29bbe38b0243f6919b70882fcfea"),  # noqa: E501
    ("train", "configparser.py", "4a70cecccb55031a413b79e6ced2e63ca031f770cd25a4882980ecdeab67f6ff"),  # noqa: E501
    ("train", "contextlib.py", "d732c045bc7450997f97b2f79cfdb1546b68d2655e89ab3170f3b19b3930d83c"),  # noqa: E501
    ("train", "dataclasses.py", "4b7e1c99ebea53b546317d218a0261895a1769f83a6b95dc0136f13578066a7f"),  # noqa: E501
    ("train", "datetime.py", "cc9bcb0f1c2f44e1a6cd51882979e113e973c2e65ed84b9aaedabb48d47aa356"),  # noqa: E501
    ("train", "difflib.py", "0c6afc23568d55b3e9ac914f9c5361e3033e778aa5b58d3cc82835fc5c638679"),  # noqa: E501
    ("train", "dis.py", "2e8d70c8cd2f4ce1fab5574f4a5ee81f5572d929da00067d14e6f6582356d240"),  # noqa: E501
    ("train", "doctest.py", "5a51c6698376a872a78052b31a95b675339a4d82ad33e28477fc5fb1af826ec0"),  # noqa: E501
    ("train", "enum.py", "84fc683aa71da233cf0f6a1bd59ffedc2bc7adb3a40f9339052141176071b6d6"),  # noqa: E501
    ("train", "fractions.py", "b11e850e354808b882d13a70a911c29accd1dbdd41757566704e3b7206c74edb"),  # noqa: E501
    ("train", "ftplib.py", "672300f448249dfd7825369e47111c37b8aa5355ef0a10df3226bd5f849e538e"),  # noqa: E501
    ("train", "functools.py", "6d80018a3fa9fed44c5b78f881987ee3ab3fb1238b077b4e6dcb4b76da7db73b"),  # noqa: E501
    ("train", "gzip.py", "8e0a7f850ef481fea41e0de9b52b4a014573b58e500ae83b92e5888d7a061008"),  # noqa: E501
    ("train", "imaplib.py", "dc3be105fb6b3e28074c4dbe0d4177c8445a803b5a935f3c4bbfe77701259c39"),  # noqa: E501
    ("train", "inspect.py", "d55ac82f84e5c93953e9f5852ec255957e6c12f47d5cc0ea456447319da0f5af"),  # noqa: E501
    ("train", "ipaddress.py", "b157f2f318650698ac4cb81f41ece82a7a860f264c24cfc8dcc538977709ced3"),  # noqa: E501
    ("train", "locale.py", "ac828df41b2fac93ba3e66a2735216c98c0e1853b8dfb9b859e301fe64153feb"),  # noqa: E501
    ("train", "mailbox.py", "e695a76d936f009d926e50eae09e34e1256ceee86ffb5b5825748e98f9080036"),  # noqa: E501
    ("train", "nntplib.py", "6a76a94b951b273aa87335d7c9c4d7273e4c59485c784b057f681443b32d9004"),  # noqa: E501
    ("train", "ntpath.py", "030fdd768135c4de3b4c56ca0f13d2f4801ccbcde4144382334cf75a477dd0de"),  # noqa: E501
    ("train", "optparse.py", "07d224301cba312fa0697bff9cd5a4bb4f778a90629632091b3f4ae874d89af5"),  # noqa: E501
    ("train", "os.py", "021bfb21a96fdaac4b2c034d40636f5e18148a8a95282661a9bc14f3fa979a99"),  # noqa: E501
    ("train", "pathlib.py", "3b21ac188fd9ac20bacc8ccd976fabd5d8ccf5000f8e157d3dfff005b228fb3d"),  # noqa: E501
    ("train", "pdb.py", "2edee4e67353513fa4aa1c9aec17dfb28136254e6648b6f42dfc3430fd0e7868"),  # noqa: E501
    ("train", "pickle.py", "f29792b7bad19b9b7a6096aae01e9a6a0a3ec28029576af74efc530ee331c412"),  # noqa: E501
    ("train", "pickletools.py", "bcc8d00ebadd684aba19169e853e6f23bc36d609ae0c8119912f1e39e9f0c1e9"),  # noqa: E501
    ("train", "pkgutil.py", "54e8463bc398757aeb01253996c0ef12e2ba8fefdef89dd2e54b15bd70669228"),  # noqa: E501
    ("train", "platform.py", "4a3cc68ba7354f8d5cc28c55315a7d77b77dcdbbaa3a092572a636b5fb5b6938"),  # noqa: E501
    ("train", "plistlib.py", "2988417c6982a0ce83aee12a2f6488bf952df8a665c4fcc6d9acc0963fe9e1c4"),  # noqa: E501
    ("train", "pprint.py", "0b67dbc8af449d8ced3acd9df902e98c2dbc56c8f2a7a181c51cc72768db621f"),  # noqa: E501
    ("train", "pstats.py", "d62d1e6a626ebd92187419bfe075a76997cce26fe99dd4520786d4a82b6ff10c"),  # noqa: E501
    ("train", "pydoc.py", "3c49fe7c6361c6c23e17a54dcd07ac74256d39f5b69a2cde3d9ad72c8f7bfe84"),  # noqa: E501
    ("train", "random.py", "b931a2d452db89ab9e1f79d59b66ce194dbd6748049cfe44699726da52b9c956"),  # noqa: E501
    ("train", "shutil.py", "d0dbfcd96ba06684aaf5d55e941aaaf36bb3a22cf537ea9d46317b363bcc5792"),  # noqa: E501
    ("train", "smtpd.py", "ef3420607dc3f2d9d7bf5238d1865942036ebb8e37c7c9a3ad8663043565a1da"),  # noqa: E501
    ("train", "smtplib.py", "b154e27998d0ef0b32fcc665299cdb30883ffe039ede3c4faac3a9db6618d35d"),  # noqa: E501
    ("train", "socket.py", "07f2010f98b7b90c237879c12f738e7305f786d7af4bc06606c4d77fd7fa9e1b"),  # noqa: E501
    ("train", "socketserver.py", "a1402df8627949d0b72591e742795fcd48f911172610d4e3c2f16bd7dcae8128"),  # noqa: E501
    ("train", "ssl.py", "e532bbe0ff12313b341a81adc389acff5b9f7dda40588929a95ee23c02bfbf45"),  # noqa: E501
    ("train", "statistics.py", "889a066f1b8063e73387ceb84018efc507a89b365b56c6afb9cc15b2ed25c2d9"),  # noqa: E501
    ("train", "subprocess.py", "2ff641d58f8696496e8718538cd96cd7afcd503ae271fb23da22422b3aee9fc7"),  # noqa: E501
    ("train", "sysconfig.py", "c16887bf792dc21f27fe5d2ca4ee271f131b7f6a88593def43be52cfbc846759"),  # noqa: E501
    ("train", "tarfile.py", "d6957647c11b6592e58e37d4e9f02f6cf9ee695cb0653b1072b542b8afac700d"),  # noqa: E501
    ("train", "tempfile.py", "c9169b0ef905999b5d347544cfaa73c4f295777ac07a948aec1e4fdf3ce98a3b"),  # noqa: E501
    ("train", "threading.py", "2c4c1db159e1178896eca324082ae98d627c8d7017d0c7135b832f4fb3117210"),  # noqa: E501
    ("train", "tokenize.py", "79aa94ebe1761811ea9b2da2ada409a8cb9abd7c6eac241d0c181a36684bb609"),  # noqa: E501
    ("train", "trace.py", "e18581573c2b0e989a66c537cf16500dcb25e60d2ab8d8b22b6723c4c1c3c70a"),  # noqa: E501
    ("train", "traceback.py", "22c8a9a4b34668acf8100613e0bd8cdc997e617e0ad69493b7e00a9b2e1e3f17"),  # noqa: E501
    ("train", "turtle.py", "787af385d6d4417aac8b686e8d5f49ce4afd7d1d09bde685bb378ed6ecc4fb7d"),  # noqa: E501
    ("train", "typing.py", "115d96e966bf35cf97126f98dd1fa854a00dd832733fc01ede58cfd4fa490660"),  # noqa: E501
    ("train", "uuid.py", "e936b632e7b14cbdad7da077edf59d1de77f5a4c8507a5e7d0028b1d336d9883"),  # noqa: E501
    ("train", "webbrowser.py", "97ce2327720d3e5515cdc6606ff0ea927d35e7f379fa08494b0c7e1274a27945"),  # noqa: E501
    ("train", "zipfile.py", "2de79ca464499be92e607a59552b4cb9cf8a9f6e000622b3673a98471c976a57"),  # noqa: E501
    ("train", "zipimport.py", "e84b98dd13d3a8ae3ff2094ef2889dcead41d754f0531686f0b70b8d225676cc"),  # noqa: E501
    ("eval", "base64.py", "7de2ffc30db7b791f482ee8e6cba30a7b69452324d466231f29395be00154b4b"),  # noqa: E501
    ("eval", "gettext.py", "a5c249a522b6b8e3aa6f1b12a8bcc09508b99ad612b58d2fc973db27ea3b7cc3"),  # noqa: E501
    ("eval", "heapq.py", "6d43277e5c76fc0f073cd388fcff852d14d068f6bb6d4886c340f8b75a1229a9"),  # noqa: E501
    ("eval", "mimetypes.py", "240e2278866203e691307bc5c4c22de4236ab14d4c4d4f45fad82dd4614cca3d"),  # noqa: E501
    ("eval", "profile.py", "4d87bdc8b85bf0a9bdee3e9d975a8a1a0c7360cb264fb68c4c48a102e718e3a3"),  # noqa: E501
    ("eval", "warnings.py", "3c36ff80a66718e3fc8449f06730e9d7bcef87d1e7f91b626b42ca4d1f30eab0"),  # noqa: E501
    ("eval", "wave.py", "95ba2de5e7be0420fea3e8aef0a9e0261df1f75f9f428e3455509a8f33dbe9f2"),  # noqa: E501
    ("eval", "weakref.py", "56f8d313fb74019e53eb9287400702fbce788b7fe30e097b0b6e06296f3f080c"),  # noqa: E501
)  # noqa: E501
# fmt: on


@functools.cache
def corpus(split: str) -> np.ndarray:
    """The bytes of one split, files joined in manifest order, after checking their hashes.

    Parameters
    ----------
    split : {"train", "eval"}
        The 64 training files (3.65 MB) or the 8 held-out ones (175 kB).

    Returns
    -------
    numpy.ndarray
        ``uint8`` bytes, read-only.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for where, name, digest in FILES:
        if where != split:
            continue
        path = root / name
        data = path.read_bytes() if path.is_file() else None
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            why = "is missing" if data is None else "differs from CPython 3.11.7's"
            raise ValueError(
                f"text corpus file {path} {why}: the text study reads the standard library "
                "of the project's pinned Python 3.11.7"
            )
        parts.append(data)
    out = np.frombuffer(b"".join(parts), dtype=np.uint8)
    out.flags.writeable = False
    return out


def _digits(gen) -> bytes:
    return bytes(int(d) + 48 for d in torch.randint(0, 10, (DIGITS,), generator=gen))


def _passkey_row(data, n, gen, depth=None) -> np.ndarray:
    """``n + 1`` bytes: filler with the passkey line inside, then the query and the digits.

    ``depth`` (evaluation): the line at that fraction of the filler, the query at the end.
    ``None`` (training): the line at a random depth, and the query followed by up to half
    the row of more text, so the query's place in the row says nothing (a model must not
    learn that rows end with it)."""
    key = _digits(gen)
    line, tail = NEEDLE + key + END, NEEDLE + key
    room = n + 1 - len(line) - len(tail)
    if room < 1:
        raise ValueError(f"length must leave room for a passkey, got {n}")
    after = 0 if depth is not None else int(torch.randint(0, room // 2 + 1, (), generator=gen))
    fill = room - after
    start = int(torch.randint(0, len(data) - room, (), generator=gen))
    filler = bytes(data[start : start + room])
    at = int(torch.randint(0, fill + 1, (), generator=gen)) if depth is None else int(depth * fill)
    row = filler[:at] + line + filler[at:fill] + tail + filler[fill:]
    return np.frombuffer(row, dtype=np.uint8)


def train_batch(data, n, batch, gen, *, passkeys=0.25):
    """A training batch of ``n`` bytes per row; a fraction ``passkeys`` of rows hold a passkey.

    Returns
    -------
    x, y : torch.Tensor
        Int64 ``(batch, n)``: inputs and next bytes.
    """
    rows = []
    for _ in range(batch):
        if float(torch.rand((), generator=gen)) < passkeys:
            rows.append(_passkey_row(data, n, gen))
        else:
            start = int(torch.randint(0, len(data) - n - 1, (), generator=gen))
            rows.append(data[start : start + n + 1])
    t = torch.from_numpy(np.stack(rows).astype(np.int64))  # (batch, n + 1)
    return t[:, :-1], t[:, 1:]


def eval_windows(data, n, total) -> torch.Tensor:
    """The first ``total`` bytes of ``data`` cut into ``total // n`` windows of ``n + 1``
    (the same text at every length). Int64 ``(total // n, n + 1)``."""
    if total % n or total + 1 > len(data):
        raise ValueError(f"total must be a multiple of n={n} within the data, got {total}")
    t = torch.from_numpy(data[: total + 1].astype(np.int64))
    return torch.stack([t[i : i + n + 1] for i in range(0, total, n)])


def passkey_batch(data, n, trials, seed):
    """``trials`` passkey rows of ``n`` bytes, depths spread evenly over the filler.

    Returns
    -------
    x, y : torch.Tensor
        Int64 ``(trials, n)``; the last ``DIGITS`` targets of each row are the key.
    """
    gen = torch.Generator().manual_seed(seed)
    depths = (np.arange(trials) + 0.5) / trials
    t = torch.from_numpy(np.stack([_passkey_row(data, n, gen, d) for d in depths]).astype(np.int64))
    return t[:, :-1], t[:, 1:]
