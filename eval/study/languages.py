"""Language codes: FLORES-200 style (``xxx_Scrp``) and MADLAD-400's codes (``{lang2}``).

`MADLAD_CODES` covers at least the languages of the paper's five families (its public code,
``configs/constants.py``, names them by MADLAD code; the FLORES-200 codes are the matching
FLORES-200/Belebele ones). A suite file overrides or extends it under ``languages:``.
"""

from __future__ import annotations

from eval.kinds.flores import CODE_RE, is_code

# FLORES-200 code -> MADLAD-400 code.
# fmt: off
MADLAD_CODES: dict[str, str] = {
    # Slavic, Baltic
    "bel_Cyrl": "be", "bul_Cyrl": "bg", "ces_Latn": "cs", "hrv_Latn": "hr", "lit_Latn": "lt",
    "lvs_Latn": "lv", "mkd_Cyrl": "mk", "pol_Latn": "pl", "rus_Cyrl": "ru", "slk_Latn": "sk",
    "slv_Latn": "sl", "srp_Cyrl": "sr", "ukr_Cyrl": "uk", "bos_Latn": "bs", "hsb_Latn": "hsb",
    # Germanic
    "afr_Latn": "af", "dan_Latn": "da", "deu_Latn": "de", "eng_Latn": "en", "fry_Latn": "fy",
    "isl_Latn": "is", "ltz_Latn": "lb", "nld_Latn": "nl", "nob_Latn": "no", "nno_Latn": "nn",
    "swe_Latn": "sv", "fao_Latn": "fo",
    # Indic and other languages of South Asia
    "asm_Beng": "as", "ben_Beng": "bn", "guj_Gujr": "gu", "hin_Deva": "hi", "kan_Knda": "kn",
    "mal_Mlym": "ml", "mar_Deva": "mr", "npi_Deva": "ne", "ory_Orya": "or", "pan_Guru": "pa",
    "sin_Sinh": "si", "snd_Arab": "sd", "tam_Taml": "ta", "tel_Telu": "te", "urd_Arab": "ur",
    # Austronesian
    "ceb_Latn": "ceb", "ilo_Latn": "ilo", "ind_Latn": "id", "jav_Latn": "jv", "mri_Latn": "mi",
    "plt_Latn": "mg", "smo_Latn": "sm", "sun_Latn": "su", "tgl_Latn": "fil", "war_Latn": "war",
    "zsm_Latn": "ms",
    # Romance
    "cat_Latn": "ca", "fra_Latn": "fr", "glg_Latn": "gl", "ita_Latn": "it", "por_Latn": "pt",
    "ron_Latn": "ro", "spa_Latn": "es",
    # Others often paired with them
    "arb_Arab": "ar", "cmn_Hans": "zh", "ell_Grek": "el", "eus_Latn": "eu", "jpn_Jpan": "ja",
    "kor_Hang": "ko", "tha_Thai": "th", "tur_Latn": "tr", "vie_Latn": "vi",
}
# fmt: on

__all__ = ["CODE_RE", "MADLAD_CODES", "is_code"]
