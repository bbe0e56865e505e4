"""Word count: the running count of each word seen on ``text-lines``, written to ``word-counts``.

Words are lower-cased and split on whitespace. Output records: key = the word (UTF-8),
value = its count so far as an 8-byte big-endian signed integer (Kafka's LongSerializer).

    pystreams topology examples/wordcount.py
"""

import pystreams as ps

app = ps.App("wordcount")
lines = app.topic("text-lines", value=ps.serdes.Text())


@app.flat_map(lines)
def words(key, line):
    for word in line.lower().split():
        yield word, 1  # a new key, so a repartition topic goes in front of the count


@app.aggregate(words, store="counts", initial=0)  # int initial: Int() values
def counts(total, key, value):
    return total + value


counts.to("word-counts")
