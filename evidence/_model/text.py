"""Page text, decoded the way a browser decodes it: the one decoder of every consumer.

Links (``_crawl.links``), rules (``_crawl.rules``) and the crawler's record of a page (the attempt's
``text_encoding``) all read a document's bytes through this module, so they can never
disagree about what a page says. It owns:

- the WHATWG Encoding Standard's label table (``encoding_for_label``): ``iso-8859-1``,
  ``latin1`` and ``ascii`` all mean windows-1252, ``utf-16`` means UTF-16LE, and a label
  not in the table is no encoding at all (browsers ignore it);
- the HTML standard's encoding sniffing algorithm (``sniff``), in its order: a byte-order
  mark; the transport layer's charset (the ``Content-Type`` header); a prescan of the
  first 1024 bytes for ``<meta charset>`` or ``<meta http-equiv=content-type content=...>``
  (or, failing those, an ``<?xml ... encoding=...?>`` declaration at the very start); the
  default, windows-1252. Each result says which step chose it (``bom``, ``header``,
  ``meta``, ``default``). A meta that names UTF-16 means UTF-8, x-user-defined means
  windows-1252, as the standard says;
- decoding (``decode``): never raises; bytes the encoding does not map become U+FFFD;
- the URL standard's query encoding (``percent_encode_query``): a link's query is
  encoded in the document's encoding, characters it cannot represent as ``&#N;``.

Decoders: single-byte encodings use Python's codec of the same name, corrected to the
WHATWG index: the C1 bytes Python leaves unmapped decode to the C1 control of the same
number, and three code points differ (koi8-u 0xAE and 0xBE, windows-1255 0xCA). Checked
against the WHATWG index files, byte by byte. Multi-byte encodings use Python's codec of
the same family (gbk is read with the gb18030 decoder, big5 with big5hkscs, shift_jis
with cp932, euc-kr with cp949, as WHATWG defines them); they may differ from the WHATWG
indexes in rare code points.
"""

from __future__ import annotations

import codecs
import re
from typing import Literal, NamedTuple

__all__ = ["Sniffed", "charset_param", "decode", "decode_document", "encoding_for_label",
           "is_html", "percent_encode_query", "sniff"]

Source = Literal["bom", "header", "meta", "default"]
DEFAULT = "windows-1252"
PRESCAN_BYTES = 1024

# The WHATWG Encoding Standard's labels: encoding name, then its labels (all lowercase).
# Checked against the standard's encodings.json: the same labels, each naming the same encoding.
_LABELS = """
utf-8 unicode-1-1-utf-8 unicode11utf8 unicode20utf8 utf-8 utf8 x-unicode20utf8
ibm866 866 cp866 csibm866 ibm866
iso-8859-2 csisolatin2 iso-8859-2 iso-ir-101 iso8859-2 iso88592 iso_8859-2 iso_8859-2:1987 l2
    latin2
iso-8859-3 csisolatin3 iso-8859-3 iso-ir-109 iso8859-3 iso88593 iso_8859-3 iso_8859-3:1988 l3
    latin3
iso-8859-4 csisolatin4 iso-8859-4 iso-ir-110 iso8859-4 iso88594 iso_8859-4 iso_8859-4:1988 l4
    latin4
iso-8859-5 csisolatincyrillic cyrillic iso-8859-5 iso-ir-144 iso8859-5 iso88595 iso_8859-5
    iso_8859-5:1988
iso-8859-6 arabic asmo-708 csiso88596e csiso88596i csisolatinarabic ecma-114 iso-8859-6
    iso-8859-6-e iso-8859-6-i iso-ir-127 iso8859-6 iso88596 iso_8859-6 iso_8859-6:1987
iso-8859-7 csisolatingreek ecma-118 elot_928 greek greek8 iso-8859-7 iso-ir-126 iso8859-7
    iso88597 iso_8859-7 iso_8859-7:1987 sun_eu_greek
iso-8859-8 csiso88598e csisolatinhebrew hebrew iso-8859-8 iso-8859-8-e iso-ir-138 iso8859-8
    iso88598 iso_8859-8 iso_8859-8:1988 visual
iso-8859-8-i csiso88598i iso-8859-8-i logical
iso-8859-10 csisolatin6 iso-8859-10 iso-ir-157 iso8859-10 iso885910 l6 latin6
iso-8859-13 iso-8859-13 iso8859-13 iso885913
iso-8859-14 iso-8859-14 iso8859-14 iso885914
iso-8859-15 csisolatin9 iso-8859-15 iso8859-15 iso885915 iso_8859-15 l9
iso-8859-16 iso-8859-16
koi8-r cskoi8r koi koi8 koi8-r koi8_r
koi8-u koi8-ru koi8-u
macintosh csmacintosh mac macintosh x-mac-roman
windows-874 dos-874 iso-8859-11 iso8859-11 iso885911 tis-620 windows-874
windows-1250 cp1250 windows-1250 x-cp1250
windows-1251 cp1251 windows-1251 x-cp1251
windows-1252 ansi_x3.4-1968 ascii cp1252 cp819 csisolatin1 ibm819 iso-8859-1 iso-ir-100
    iso8859-1 iso88591 iso_8859-1 iso_8859-1:1987 l1 latin1 us-ascii windows-1252 x-cp1252
windows-1253 cp1253 windows-1253 x-cp1253
windows-1254 cp1254 csisolatin5 iso-8859-9 iso-ir-148 iso8859-9 iso88599 iso_8859-9
    iso_8859-9:1989 l5 latin5 windows-1254 x-cp1254
windows-1255 cp1255 windows-1255 x-cp1255
windows-1256 cp1256 windows-1256 x-cp1256
windows-1257 cp1257 windows-1257 x-cp1257
windows-1258 cp1258 windows-1258 x-cp1258
x-mac-cyrillic x-mac-cyrillic x-mac-ukrainian
gbk chinese csgb2312 csiso58gb231280 gb2312 gb_2312 gb_2312-80 gbk iso-ir-58 x-gbk
gb18030 gb18030
big5 big5 big5-hkscs cn-big5 csbig5 x-x-big5
euc-jp cseucpkdfmtjapanese euc-jp x-euc-jp
iso-2022-jp csiso2022jp iso-2022-jp
shift_jis csshiftjis ms932 ms_kanji shift-jis shift_jis sjis windows-31j x-sjis
euc-kr cseuckr csksc56011987 euc-kr iso-ir-149 korean ks_c_5601-1987 ks_c_5601-1989 ksc5601
    ksc_5601 windows-949
replacement csiso2022kr hz-gb-2312 iso-2022-cn iso-2022-cn-ext iso-2022-kr replacement
utf-16be unicodefffe utf-16be
utf-16le csunicode iso-10646-ucs-2 ucs-2 unicode unicodefeff utf-16 utf-16le
x-user-defined x-user-defined
"""
_ENCODINGS: dict[str, str] = {}
for _entry in re.split(r"\n(?! )", _LABELS.strip()):  # an indented line continues its entry
    _name, *_labels = _entry.split()
    _ENCODINGS.update(dict.fromkeys(_labels, _name))

# Python's codec for each single-byte encoding, and where the WHATWG index differs from it
# beyond the C1 rule (see the module docstring).
_SINGLE_BYTE = {
    "ibm866": "cp866", "iso-8859-2": "iso8859_2", "iso-8859-3": "iso8859_3",
    "iso-8859-4": "iso8859_4", "iso-8859-5": "iso8859_5", "iso-8859-6": "iso8859_6",
    "iso-8859-7": "iso8859_7", "iso-8859-8": "iso8859_8", "iso-8859-8-i": "iso8859_8",
    "iso-8859-10": "iso8859_10", "iso-8859-13": "iso8859_13", "iso-8859-14": "iso8859_14",
    "iso-8859-15": "iso8859_15", "iso-8859-16": "iso8859_16", "koi8-r": "koi8_r",
    "koi8-u": "koi8_u", "macintosh": "mac_roman", "windows-874": "cp874",
    "windows-1250": "cp1250", "windows-1251": "cp1251", "windows-1252": "cp1252",
    "windows-1253": "cp1253", "windows-1254": "cp1254", "windows-1255": "cp1255",
    "windows-1256": "cp1256", "windows-1257": "cp1257", "windows-1258": "cp1258",
    "x-mac-cyrillic": "mac_cyrillic",
}
_INDEX_FIXES = {"koi8-u": {0xAE: "\u045e", 0xBE: "\u040e"}, "windows-1255": {0xCA: "\u05ba"}}
# Decoders and (for URL queries) encoders of the multi-byte encodings.
_MULTI_BYTE = {  # name: (decoder, encoder)
    "gbk": ("gb18030", "gbk"), "gb18030": ("gb18030", "gb18030"),
    "big5": ("big5hkscs", "big5"), "euc-jp": ("euc_jp", "euc_jp"),
    "iso-2022-jp": ("iso2022_jp", "iso2022_jp"), "shift_jis": ("cp932", "cp932"),
    "euc-kr": ("cp949", "cp949"),
}
_UNMAPPED = "\ufffe"  # charmap_decode's "no character here"


def _single_byte_table(name: str) -> str:
    """The 256-character decoding table of a single-byte encoding, as WHATWG indexes it."""
    chars = []
    fixes = _INDEX_FIXES.get(name, {})
    for byte in range(256):
        try:
            char = bytes([byte]).decode(_SINGLE_BYTE[name])
        except UnicodeDecodeError:
            char = chr(byte) if 0x80 <= byte <= 0x9F else _UNMAPPED
        chars.append(fixes.get(byte, char))
    return "".join(chars)


_TABLES: dict[str, str] = {}
_ENCODE_MAPS: dict[str, object] = {}


def _table(name: str) -> str:
    table = _TABLES.get(name)
    if table is None:
        if name == "x-user-defined":
            table = "".join(chr(b) if b < 0x80 else chr(0xF780 + b - 0x80) for b in range(256))
        else:
            table = _single_byte_table(name)
        _TABLES[name] = table
    return table


class Sniffed(NamedTuple):
    """The encoding a document is read in, and the step of the sniffing that chose it."""

    encoding: str  # a WHATWG encoding name, e.g. "windows-1252"
    source: Source


def encoding_for_label(label: str | None) -> str | None:
    """The WHATWG "get an encoding": the encoding a label names, or None if none."""
    if not label:
        return None
    return _ENCODINGS.get(label.strip("\t\n\f\r ").lower())


# --- the transport layer --------------------------------------------------------------

_PARAM_RE = re.compile(r';[\t ]*([^\t ;=]+)[\t ]*=[\t ]*("(?:[^"\\]|\\.)*"?|[^;]*)')


def charset_param(content_type: str | None) -> str | None:
    """The ``charset`` parameter of a Content-Type value (the first one), unquoted."""
    if not content_type or "charset" not in content_type.lower():
        return None
    name: str
    value: str
    for name, value in _PARAM_RE.findall(content_type):
        if name.lower() == "charset":
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:].removesuffix('"'))
            return value.strip("\t\n\f\r ")
    return None


def is_html(content_type: str | None) -> bool:
    """Whether a Content-Type names an HTML document (text/html or XHTML)."""
    media = (content_type or "").partition(";")[0].strip().lower()
    return media in ("text/html", "application/xhtml+xml")


# --- sniffing ---------------------------------------------------------------------------

_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_BE, "utf-16be"),
         (codecs.BOM_UTF16_LE, "utf-16le"))


def _bom(data: bytes) -> str | None:
    for mark, name in _BOMS:
        if data.startswith(mark):
            return name
    return None


def sniff(data: bytes | bytearray | memoryview, transport: str | None = None) -> Sniffed:
    """The HTML standard's encoding sniffing: BOM, ``transport`` label, prescan, default.

    ``transport`` is the charset the server declared (``charset_param`` of its
    Content-Type); a label that names no encoding is ignored, as browsers ignore it.
    """
    head = bytes(memoryview(data)[:PRESCAN_BYTES])
    bom = _bom(head)
    if bom is not None:
        return Sniffed(bom, "bom")
    declared = encoding_for_label(transport)
    if declared is not None:
        return Sniffed(declared, "header")
    found = _prescan(head)
    if found is not None:
        return Sniffed(found, "meta")
    return Sniffed(DEFAULT, "default")


_SPACE = b"\t\n\f\r "
_LETTERS = frozenset(range(0x41, 0x5B)) | frozenset(range(0x61, 0x7B))
_ATTR_END = b"\t\n\f\r />"


def _prescan(data: bytes) -> str | None:
    """The HTML standard's "prescan a byte stream to determine its encoding", on ``data``
    (the first 1024 bytes): running out of bytes ends it, as the end condition does."""
    if data.startswith(b"<\x00?\x00x\x00"):
        return "utf-16le"
    if data.startswith(b"\x00<\x00?\x00x"):
        return "utf-16be"
    n, pos = len(data), 0
    while pos < n:
        if data.startswith(b"<!--", pos):
            end = data.find(b"-->", pos + 2)  # the dashes of "<!--" may be the closing ones
            if end < 0:
                break
            pos = end + 3
            continue
        if data[pos:pos + 5].lower() == b"<meta" and pos + 5 < n and data[pos + 5] in b"\t\n\f\r /":
            found, pos = _meta(data, pos + 5)
            if found is not None:
                return found
            continue
        if data[pos] == 0x3C and pos + 1 < n:  # '<'
            nxt = data[pos + 1]
            letter_at = pos + 2 if nxt == 0x2F else pos + 1  # '</' then a letter, or '<' letter
            if letter_at < n and data[letter_at] in _LETTERS:
                pos = letter_at
                while pos < n and data[pos] not in b"\t\n\f\r >":
                    pos += 1
                while True:  # skip the tag's attributes
                    attr, pos = _attribute(data, pos)
                    if attr is None:
                        break
                pos += 1
                continue
            if nxt in b"!/?":
                end = data.find(b">", pos + 1)
                if end < 0:
                    break
                pos = end + 1
                continue
        pos += 1
    return _xml_declaration(data)


def _meta(data: bytes, pos: int) -> tuple[str | None, int]:
    """The attributes of one ``<meta``: (the encoding it declares or None, where it ends)."""
    seen: set[bytes] = set()
    got_pragma = False
    need_pragma: bool | None = None
    charset: str | bool | None = None  # False: a label that named no encoding
    while True:
        attr, pos = _attribute(data, pos)
        if attr is None:
            break
        name, value = attr
        if name in seen:
            continue
        seen.add(name)
        if name == b"http-equiv":
            got_pragma = got_pragma or value == b"content-type"
        elif name == b"content":
            found = _charset_in_content(value)
            if found is not None and charset is None:
                charset, need_pragma = found, True
        elif name == b"charset":
            charset = encoding_for_label(value.decode("latin-1")) or False
            need_pragma = False
    if pos >= len(data):  # ran out of bytes inside the tag: the prescan ends
        return None, pos
    pos += 1
    if need_pragma is None or (need_pragma and not got_pragma) or not charset:
        return None, pos
    assert isinstance(charset, str)
    if charset in ("utf-16be", "utf-16le"):
        return "utf-8", pos
    if charset == "x-user-defined":
        return "windows-1252", pos
    return charset, pos


def _attribute(data: bytes, pos: int) -> tuple[tuple[bytes, bytes] | None, int]:
    """The HTML standard's "get an attribute": ((lowercased name, value) or None, position).

    Returns None at '>' or when the bytes run out (the position is then at the '>', or at
    the end)."""
    n = len(data)
    while pos < n and data[pos] in b"\t\n\f\r /":
        pos += 1
    if pos >= n or data[pos] == 0x3E:
        return None, pos
    name = bytearray()
    while True:
        if pos >= n:
            return None, pos
        byte = data[pos]
        if byte == 0x3D and name:  # '='
            pos += 1
            break
        if byte in _SPACE:
            while pos < n and data[pos] in _SPACE:
                pos += 1
            if pos >= n:
                return None, pos
            if data[pos] != 0x3D:
                return (bytes(name), b""), pos
            pos += 1
            break
        if byte in b"/>":
            return (bytes(name), b""), pos
        name.append(byte + 0x20 if 0x41 <= byte <= 0x5A else byte)
        pos += 1
    while pos < n and data[pos] in _SPACE:
        pos += 1
    if pos >= n:
        return None, pos
    quote = data[pos]
    if quote in b"\"'":
        end = data.find(bytes([quote]), pos + 1)
        if end < 0:
            return None, n
        return (bytes(name), data[pos + 1:end].lower()), end + 1
    if quote == 0x3E:
        return (bytes(name), b""), pos
    start = pos
    while pos < n and data[pos] not in b"\t\n\f\r >":
        pos += 1
    if pos >= n:
        return None, pos
    return (bytes(name), data[start:pos].lower()), pos


def _charset_in_content(value: bytes) -> str | None:
    """The HTML standard's "extracting a character encoding from a meta element"."""
    lower, pos = value.lower(), 0
    while True:
        found = lower.find(b"charset", pos)
        if found < 0:
            return None
        pos = found + 7
        while pos < len(value) and value[pos] in _SPACE:
            pos += 1
        if value[pos:pos + 1] != b"=":
            continue  # look again from just before that character
        pos += 1
        while pos < len(value) and value[pos] in _SPACE:
            pos += 1
        quote = value[pos:pos + 1]
        if quote in (b'"', b"'"):
            end = value.find(quote, pos + 1)
            return None if end < 0 else encoding_for_label(value[pos + 1:end].decode("latin-1"))
        end = pos
        while end < len(value) and value[end] not in b"\t\n\f\r ;":
            end += 1
        return encoding_for_label(value[pos:end].decode("latin-1"))


_XML_ENCODING_RE = re.compile(rb"encoding[\x00-\x20]*=[\x00-\x20]*([\"'])([^\"']*?)\1")


def _xml_declaration(data: bytes) -> str | None:
    """The HTML standard's "get an XML encoding" (when the prescan found nothing)."""
    if not data.startswith(b"<?xml"):
        return None
    end = data.find(b">")
    if end < 0:
        return None
    match = _XML_ENCODING_RE.search(data, 0, end)
    if match is None or any(b <= 0x20 for b in match.group(2)):
        return None
    found = encoding_for_label(match.group(2).decode("latin-1"))
    return "utf-8" if found in ("utf-16be", "utf-16le") else found


# --- decoding ---------------------------------------------------------------------------

def decode(data: bytes | bytearray | memoryview, encoding: str) -> str:
    """``data`` as text in a WHATWG ``encoding`` (a BOM still wins); never raises."""
    view = memoryview(data)
    bom = _bom(bytes(view[:3]))
    if bom is not None:
        encoding = bom
        view = view[3 if bom == "utf-8" else 2:]
    if encoding == "utf-8":
        return str(view, "utf-8", "replace")
    if encoding in ("utf-16le", "utf-16be"):
        return str(view, "utf-16-le" if encoding == "utf-16le" else "utf-16-be", "replace")
    if encoding == "replacement":
        return "\ufffd" if len(view) else ""
    if encoding in _MULTI_BYTE:
        return str(view, _MULTI_BYTE[encoding][0], "replace")
    if encoding in _SINGLE_BYTE or encoding == "x-user-defined":
        return codecs.charmap_decode(view, "replace", _table(encoding))[0]
    raise ValueError(f"not a WHATWG encoding name: {encoding!r}")


def decode_document(data: bytes | bytearray | memoryview,
                    content_type: str | None) -> tuple[str, Sniffed]:
    """A document's text, sniffed from its bytes and its Content-Type, and how it was read."""
    sniffed = sniff(data, charset_param(content_type))
    return decode(data, sniffed.encoding), sniffed


# --- URL queries ------------------------------------------------------------------------

def _url_error(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeEncodeError)  # registered for encoding only
    # The URL standard's "percent-encode after encoding": a code point the encoding cannot
    # represent is written as "&#N;", percent-encoded. ASCII: every encoder keeps it as is.
    bad = exc.object[exc.start:exc.end]
    return "".join(f"%26%23{ord(c)}%3B" for c in bad), exc.end


codecs.register_error("evidence-url-ncr", _url_error)
_NON_ASCII_RE = re.compile(r"[^\x00-\x7f]+")
# The URL standard's query percent-encode set (special schemes), beyond what the encoder
# output leaves: C0 controls, space, ", #, <, >, ' and every byte over 0x7E.
_QUERY_SET = frozenset(b"\"#<>' ") | frozenset(range(0x21)) | frozenset(range(0x7F, 0x100))


def _encode(text: str, encoding: str) -> bytes:
    if encoding in _MULTI_BYTE:
        return text.encode(_MULTI_BYTE[encoding][1], "evidence-url-ncr")
    mapping = _ENCODE_MAPS.get(encoding)
    if mapping is None:
        mapping = _ENCODE_MAPS[encoding] = codecs.charmap_build(_table(encoding))
    return codecs.charmap_encode(text, "evidence-url-ncr", mapping)[0]  # type: ignore[arg-type]


def percent_encode_query(query: str, encoding: str | None) -> str:
    """A query's non-ASCII characters percent-encoded in a document's encoding.

    UTF-8 (and UTF-16 and replacement documents, whose URLs use UTF-8) leave the query as
    it is: the URL normalizer encodes it as UTF-8. ASCII characters are never touched.
    """
    if (encoding is None or encoding in ("utf-8", "utf-16be", "utf-16le", "replacement")
            or query.isascii()):
        return query

    def run(match: re.Match[str]) -> str:
        data = _encode(match.group(), encoding)
        return "".join(chr(b) if b not in _QUERY_SET else f"%{b:02X}" for b in data)

    return _NON_ASCII_RE.sub(run, query)
