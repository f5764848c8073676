"""The data.sources text of a mixture's sources: what a test writes into a config to name
them (bertjax.data.mixture.parse_sources reads it back)."""

from bertjax.data.mixture import PATH_SEPARATOR, SOURCE_OPTIONS, Source


def format_sources(sources: tuple[Source, ...]) -> str:
    """The data.sources text that parse_sources reads back as these sources."""
    entries = []
    defaults = Source("x", ("x",), 1.0)
    for source in sources:
        entry = f"{source.name}={PATH_SEPARATOR.join(source.paths)}:{source.weight!r}"
        for option in SOURCE_OPTIONS:
            value = getattr(source, option)
            if value != getattr(defaults, option):
                entry += (
                    f":{option}={value!r}" if isinstance(value, float) else f":{option}={value}"
                )
        entries.append(entry)
    return ",".join(entries)
