"""A deterministic corpus of byte strings for the tokenizer parity test (tokenizer_parity_interop.py,
docs/data.md "Tokenization") and the training text of the GPT-2 BPE fixture
(tools/reference/make_gpt2_bpe_fixture.py).

Each record is a random mix (random.Random(seed)) of: words in Latin (with accents, precomposed and
combining), Greek, Cyrillic, Arabic, Hebrew, Devanagari, Thai, Hangul, kana and CJK scripts; emoji
with ZWJ sequences, skin tones and variation selectors; runs of spaces, tabs, newlines, CR LF, NBSP,
U+2003, U+202F and U+3000; numbers in ASCII, Arabic-Indic, Devanagari and full-width digits;
punctuation of several scripts; English contractions in both cases; code; the special-token strings
of the three tokenizers under test; and bytes that are not UTF-8 (stray continuation bytes, truncated
and overlong sequences, surrogates, values above U+10FFFF). No character assigned after Unicode 13
is used, so the Unicode versions of PCRE2, Oniguruma and Python cannot disagree on them.

Records can hold newlines, so a corpus file stores each as "LENGTH\\n" + the bytes + "\\n"
(write_corpus; the C++ probe, tokenizer_probe.cpp, reads that layout).
"""
import random

LATIN = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "World", "data", "model",
         "tokenizer", "pre-training", "naïve", "café", "façade", "Übermaß", "straße", "señor", "Ångström",
         "déjà", "vu", "œuvre", "Łódź", "Dvořák", "İstanbul", "ﬁnal", "ǅemal", "MIXEDcase", "camelCaseWord",
         "snake_case_word", "e\u0301te\u0301", "a\u0308bc", "n\u0303o", "Z\u0335a\u0336l\u0337g\u0338o"]
GREEK = ["αλφα", "βήτα", "Ελληνικά", "λόγος", "ΣΟΦΙΑ", "ς", "ἀρχή"]
CYRILLIC = ["привет", "мир", "Москва", "ёлка", "ЪЫЬ", "украї\u0301нська", "Беларусь", "щука"]
ARABIC = ["مرحبا", "العالم", "السَّلَامُ", "عَلَيْكُم", "كتاب", "ﻻ", "\u0640\u0640"]
HEBREW = ["שלום", "עולם", "בְּרֵאשִׁית"]
DEVANAGARI = ["नमस्ते", "दुनिया", "हिन्दी", "क्षत्रिय", "ज़िन्दगी", "ॐ"]
THAI = ["สวัสดี", "ภาษาไทย", "กรุงเทพมหานคร"]
HANGUL = ["안녕하세요", "세계", "한국어", "각"]
KANA = ["こんにちは", "カタカナ", "ひらがな", "ｶﾀｶﾅ", "ー"]
CJK = ["你好", "世界", "中文分词", "漢字", "東京", "日本語", "北京大学", "𠀀𠀁", "〇"]
EMOJI = ["😀", "🚀", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏻‍💻", "❤️", "☺︎", "🇫🇷", "🇯🇵", "1️⃣", "🧑‍🤝‍🧑",
         "🤷‍♀️", "✊🏾", "🐻‍❄️", "💯"]
WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n    ", "\u00a0", "\u00a0\u00a0",
              "\u3000", "\u3000\u3000", "\u2003", "\u202f", " \t \n", "\u2009", "\u2028", "\x0b", "\x0c", "\u0085"]
PUNCTUATION = [".", ",", ";", ":", "!", "?", "...", "…", "—", "–", "-", "(", ")", "[", "]", "{", "}", "\"", "'",
               "«", "»", "“", "”", "„", "¿", "¡", "、", "。", "！", "？", "،", "؟", "।", "॥", "@", "#", "$", "%",
               "^", "&", "*", "+", "=", "/", "\\", "|", "~", "`", "<", ">", "€", "£", "¥", "©", "®", "™", "°",
               "±", "×", "÷", "§", "¶", "•", "→", "∑", "∞", "√", "≠", "≤", "♥", "★", "\u00ad", "\u200b", "\u200d",
               "\ufeff", "\x7f", "\x01", "\x00"]
CONTRACTIONS = ["it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "DON'T", "We'Re", "O'Neil",
                "rock'n'roll", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "''", "'", "' s", "’s", "isn’t",
                "y'all'd've"]
CODE = ["def f(x):\n    return x ** 2  # square\n", "if (a && b) { x += 1; }", "for i in range(10):\n\tprint(i)",
        "<div class=\"note\">Hi</div>", "SELECT * FROM t WHERE id = 42;", "x_1 = y__2 + z3", "#include <vector>",
        "std::vector<int> v{1, 2, 3};", "a->b.c[0] = 0xFF;", "let s = \"tab\\tnew\\nline\";", "{\"key\": [1, 2.5e-3, null]}",
        "$ ls -la | grep '.py'", "    indented\n        more", "// TODO: fix\r\n", "λx. x + 1", "i++; --j;",
        "`backticks` and ~tilde~", "https://example.com/a?b=c&d=e#f"]
SPECIALS = ["<|endoftext|>", "<eos>", "<bos>", "<pad>", "<unk>", "<|turn>", "<turn|>", "<image>", "<boi>", "<eoi>",
            "<|channel>", "<channel|>", "<|think|>", "<|endoftext", "endoftext|>", "<eos", "<|turn|>"]
INVALID = [b"\xff", b"\xfe", b"\x80", b"\xbf\xbf", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
           b"\xf0\x9f", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf",
           b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\x80\x80\x80", b"\xc2\xc2", b"\xe1\x80\xe1"]
# Code point ranges to draw single characters from (letters, digits, marks, symbols; Unicode <= 13).
RANGES = [(0x21, 0x7E), (0xA1, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x5D0, 0x5EA), (0x620, 0x64A), (0x660, 0x669),
          (0x900, 0x97F), (0xE01, 0xE3A), (0x1100, 0x1112), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FA5),
          (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x1F600, 0x1F64F), (0x2200, 0x22FF), (0x300, 0x36F), (0x2460, 0x24FF)]
SCRIPTS = [LATIN, GREEK, CYRILLIC, ARABIC, HEBREW, DEVANAGARI, THAI, HANGUL, KANA, CJK]


def number(rng):
    digits = rng.choice(["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９"])
    text = "".join(rng.choice(digits) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.3:
        text += rng.choice([".", ",", "/", ":", "e-", "%"]) + "".join(rng.choice(digits) for _ in range(rng.randint(1, 4)))
    return text


def fragment(rng):
    kind = rng.random()
    if kind < 0.30:
        return rng.choice(rng.choice(SCRIPTS))
    if kind < 0.40:
        return rng.choice(WHITESPACE)
    if kind < 0.48:
        return rng.choice(PUNCTUATION)
    if kind < 0.55:
        return number(rng)
    if kind < 0.62:
        return rng.choice(CONTRACTIONS)
    if kind < 0.67:
        return rng.choice(EMOJI)
    if kind < 0.72:
        return rng.choice(CODE)
    if kind < 0.77:
        return rng.choice(SPECIALS)
    if kind < 0.81:
        return rng.choice(INVALID)
    low, high = rng.choice(RANGES)
    return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 6)))


def record(rng):
    parts = []
    for _ in range(rng.randint(1, 24)):
        piece = fragment(rng)
        parts.append(piece if isinstance(piece, bytes) else piece.encode())
        if rng.random() < 0.6:
            parts.append(b" ")
    return b"".join(parts)


def corpus(seed, count):
    rng = random.Random(seed)
    return [record(rng) for _ in range(count)]


def write_corpus(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(b"%d\n" % len(r) + r + b"\n")

