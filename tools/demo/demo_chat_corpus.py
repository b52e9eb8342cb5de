"""The demo model's synthetic chat corpus: Gemma 4 conversations with a weather, time and calculator
tool set, plain chats answered from a small fact table, and fortune requests (docs/DESIGN.md §6,
"Demo model"). Pure Python, seeded, licence-clean (every sentence is written here).

Each example is what the model sees at inference plus what it should write:

    text = render(messages, tools, add_generation_prompt=True) + completion

`render` is the official 31B-IT template (tests/fixtures/chat-templates/gemma-4-31B-it.jinja)
written out in Python for the parts the corpus uses: system turn, tool declarations, user and model
turns, tool calls and tool responses, thinking off. A completion is what the template writes for
the model's next message: a tool call followed by <|tool_response> (where generation stops and the
caller appends the response), or an answer followed by <turn|> (the stop token; the "\n" after it
belongs to the next prompt). `check` proves both against the template rendered by a real Jinja
engine (npm @huggingface/jinja@0.5.11, the package and version tests/test_chat_template_jinja.cpp
installs):

    python3 tools/demo/demo_chat_corpus.py check NODE_MODULES_DIR [COUNT]   # prints "N examples equal"
    python3 tools/demo/demo_chat_corpus.py sample [COUNT]                   # prints example texts

tools/demo/train_demo.py imports `chat_examples` (and the fortunes from tools/demo/demo_corpus.py).
"""
import json
import os
import random
import subprocess
import sys
import tempfile

CHAT_SEED = 20261201
Q = '<|"|>'  # Gemma 4's string delimiter inside declarations, calls and responses

# ---------------------------------------------------------------------------------------------
# The official template, for the subset the corpus uses (names follow the template's macros).

STANDARD_KEYS = ("description", "type", "properties", "required", "nullable")


def _dictsort(mapping):
    # Jinja's dictsort compares keys case-insensitively; the corpus's keys are lower case anyway.
    return sorted(mapping.items(), key=lambda kv: kv[0].lower())


def format_argument(value, escape_keys=True):
    if isinstance(value, str):
        return Q + value + Q
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        parts = [(Q + k + Q if escape_keys else k) + ":" + format_argument(v, escape_keys) for k, v in _dictsort(value)]
        return "{" + ",".join(parts) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_argument(v, escape_keys) for v in value) + "]"
    if isinstance(value, float) and value == int(value):
        raise ValueError("integral floats print differently in Python's and JS's Jinja: use an int")
    return str(value)


def format_parameters(properties):
    out = []
    for key, value in _dictsort(properties):
        if key in STANDARD_KEYS:
            continue
        text = key + ":{"
        add_comma = False
        if value.get("description"):
            text += "description:" + Q + value["description"] + Q
            add_comma = True
        if value["type"].upper() == "STRING" and value.get("enum"):
            text += ("," if add_comma else "") + "enum:" + format_argument(value["enum"])
            add_comma = True
        if value["type"].upper() not in ("STRING", "NUMBER", "INTEGER", "BOOLEAN"):
            raise ValueError("the corpus declares scalar parameters only")
        text += ("," if add_comma else "") + "type:" + Q + value["type"].upper() + Q + "}"
        out.append(text)
    return ",".join(out)


def format_function_declaration(tool):
    function = tool["function"]
    text = "declaration:" + function["name"] + "{description:" + Q + function["description"] + Q
    params = function.get("parameters")
    if params:
        text += ",parameters:{"
        if params.get("properties"):
            text += "properties:{" + format_parameters(params["properties"]) + "},"
        if params.get("required"):
            text += "required:[" + ",".join(Q + r + Q for r in params["required"]) + "],"
        if params.get("type"):
            text += "type:" + Q + params["type"].upper() + Q + "}"
    return text + "}"


def _strip(text):
    # The template's `| trim` (Python's str.strip in transformers); the corpus's text has no
    # whitespace where Python's and JS's trims differ (docs/DESIGN.md §5).
    return text.strip()


def render(messages, tools=None, add_generation_prompt=True):
    """The official template's text for these messages, thinking off, bos_token "<bos>"."""
    out = "<bos>"
    prev = None
    loop_messages = messages
    if tools or messages[0]["role"] in ("system", "developer"):
        out += "<|turn>system\n"
        if messages[0]["role"] in ("system", "developer"):
            out += _strip(messages[0]["content"])
            loop_messages = messages[1:]
        for tool in tools or []:
            out += "<|tool>" + _strip(format_function_declaration(tool)) + "<tool|>"
            prev = "tool"
        out += "<turn|>\n"
    for message in loop_messages:
        role = "model" if message["role"] == "assistant" else message["role"]
        if not (prev == "tool_response" and message.get("tool_calls")):
            out += "<|turn>" + role + "\n"
        prev = None
        for call in message.get("tool_calls") or []:
            function = call["function"]
            args = ",".join(k + ":" + format_argument(v, escape_keys=False) for k, v in _dictsort(function["arguments"]))
            out += "<|tool_call>call:" + function["name"] + "{" + args + "}<tool_call|>"
            prev = "tool_call"
        for response in message.get("tool_responses") or []:
            value = response["response"]
            if isinstance(value, dict):
                body = ",".join(k + ":" + format_argument(v, escape_keys=False) for k, v in _dictsort(value))
            else:
                body = "value:" + format_argument(value, escape_keys=False)
            out += "<|tool_response>response:" + response["name"] + "{" + body + "}<tool_response|>"
            prev = "tool_response"
        content = message.get("content")
        if isinstance(content, str):
            if "<|channel>" in content or "<channel|>" in content:
                raise ValueError("the corpus writes no thoughts")
            out += _strip(content)
        if not (message.get("tool_responses") and not content):
            out += "<turn|>\n"
    if add_generation_prompt:
        if prev != "tool_response":
            out += "<|turn>model\n"
        out += "<|channel>thought\n<channel|>"
    return out


# ---------------------------------------------------------------------------------------------
# The world the conversations talk about.

PLACES = ["Paris", "London", "Tokyo", "New York", "Berlin", "Madrid", "Rome", "Sydney", "Cairo", "Lagos",
          "Mumbai", "Beijing", "Seoul", "Toronto", "Mexico City", "Moscow", "Istanbul", "Dubai", "Nairobi",
          "Lima", "Oslo", "Stockholm", "Helsinki", "Dublin", "Lisbon", "Vienna", "Prague", "Warsaw", "Athens",
          "Amsterdam", "Brussels", "Zurich", "Bangkok", "Singapore", "Jakarta", "Manila", "Hanoi",
          "Buenos Aires", "Santiago", "Chicago", "Los Angeles", "San Francisco", "Seattle", "Boston",
          "Miami", "Vancouver", "Montreal", "Cape Town", "Casablanca", "Reykjavik", "Edinburgh", "Munich",
          "Barcelona", "Kyoto", "Osaka", "Delhi", "Hamburg", "Lyon", "Marseille", "Nice", "Venice",
          "Florence", "Milan", "Copenhagen", "Budapest", "Krakow", "Auckland", "Melbourne", "Denver",
          "Houston", "Dallas", "Atlanta", "Havana", "Quito", "Accra", "Dakar", "Tunis", "Porto", "Seville",
          "Valencia", "Geneva", "Bern", "Glasgow", "Cardiff", "Bristol", "Manchester", "Kigali", "Perth"]

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("South Korea", "Seoul"),
            ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"),
            ("Peru", "Lima"), ("Chile", "Santiago"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Ghana", "Accra"),
            ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
            ("Ireland", "Dublin"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Greece", "Athens"),
            ("the Netherlands", "Amsterdam"), ("Belgium", "Brussels"), ("Switzerland", "Bern"),
            ("Thailand", "Bangkok"), ("Indonesia", "Jakarta"), ("Vietnam", "Hanoi"), ("India", "New Delhi"),
            ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Iceland", "Reykjavik"),
            ("Hungary", "Budapest"), ("the Czech Republic", "Prague"), ("Turkey", "Ankara"),
            ("Morocco", "Rabat"), ("Senegal", "Dakar"), ("Cuba", "Havana"), ("Ecuador", "Quito"),
            ("the United Kingdom", "London"), ("the United States", "Washington"), ("Russia", "Moscow")]

ANIMALS = [("cat", "meow"), ("dog", "woof"), ("cow", "moo"), ("duck", "quack"), ("sheep", "baa"),
           ("owl", "hoot"), ("horse", "neigh"), ("pig", "oink"), ("frog", "ribbit"), ("lion", "roar"),
           ("mouse", "squeak"), ("goat", "maa"), ("rooster", "cock-a-doodle-doo"), ("snake", "hiss"),
           ("bee", "buzz")]

COLOURS = [("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("a banana", "yellow"),
           ("a ripe tomato", "red"), ("coal", "black"), ("an orange", "orange"), ("a lemon", "yellow"),
           ("the sea", "blue"), ("a carrot", "orange"), ("chocolate", "brown"), ("milk", "white"),
           ("a strawberry", "red"), ("a leaf in summer", "green"), ("a plum", "purple")]

OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("fast", "slow"),
             ("open", "closed"), ("happy", "sad"), ("light", "dark"), ("early", "late"), ("old", "new"),
             ("wet", "dry"), ("full", "empty"), ("strong", "weak"), ("left", "right"), ("inside", "outside"),
             ("loud", "quiet"), ("hard", "soft"), ("high", "low"), ("first", "last"), ("win", "lose")]

COUNTS = [("How many days are in a week?", "A week has seven days."),
          ("How many months are in a year?", "A year has twelve months."),
          ("How many hours are in a day?", "A day has twenty-four hours."),
          ("How many minutes are in an hour?", "An hour has sixty minutes."),
          ("How many seconds are in a minute?", "A minute has sixty seconds."),
          ("How many legs does a spider have?", "A spider has eight legs."),
          ("How many legs does a dog have?", "A dog has four legs."),
          ("How many continents are there?", "There are seven continents."),
          ("How many colours are in a rainbow?", "A rainbow has seven colours."),
          ("How many sides does a triangle have?", "A triangle has three sides."),
          ("How many sides does a square have?", "A square has four sides."),
          ("How many letters are in the English alphabet?", "The English alphabet has twenty-six letters."),
          ("How many players are on a football team?", "A football team has eleven players on the field."),
          ("What is the first day of the week?", "In many countries the week starts on Monday."),
          ("What is the last month of the year?", "December is the last month of the year."),
          ("What is the largest planet?", "Jupiter is the largest planet in the solar system."),
          ("What is the closest star to Earth?", "The Sun is the closest star to Earth."),
          ("What do bees make?", "Bees make honey."),
          ("What do plants need to grow?", "Plants need light, water and air to grow."),
          ("At what temperature does water freeze?", "Water freezes at 0 °C, which is 32 °F."),
          ("At what temperature does water boil?", "At sea level water boils at 100 °C, which is 212 °F.")]

CONDITIONS = ["sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "clear", "partly cloudy", "stormy",
              "drizzly", "overcast", "humid"]

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a friendly assistant.",
                  "You are a helpful assistant. Answer briefly.", "You are a concise assistant.",
                  "You are a helpful assistant with access to tools."]

# ---------------------------------------------------------------------------------------------
# Tool declarations (OpenAI's shape, as a client sends them), varied so that the model reads the
# names it must call from the declaration instead of memorising one spelling.

WEATHER_NAMES = ["get_weather"] * 4 + ["get_current_weather", "weather", "lookup_weather"]
WEATHER_DESCRIPTIONS = ["Get the current weather for a location.", "Get the current weather in a given city.",
                        "Returns the current weather for a city.", "Look up today's weather for a place.",
                        "Get the weather"]
TIME_NAMES = ["get_time"] * 3 + ["get_current_time", "local_time"]
TIME_DESCRIPTIONS = ["Get the current local time in a city.", "Returns the local time for a location.",
                     "Get the time in a place."]
CALC_NAMES = ["calculate"] * 3 + ["calculator", "evaluate"]
CALC_DESCRIPTIONS = ["Evaluate an arithmetic expression.", "Calculate the value of a math expression.",
                     "A calculator for arithmetic."]
LOCATION_DESCRIPTIONS = ["City name, e.g. Paris", "The city", "The city and country, e.g. Paris, France",
                         "The name of the city", None]


def _param(kind, description, enum=None):
    p = {"type": kind}
    if description:
        p["description"] = description
    if enum:
        p["enum"] = enum
    return p


def weather_tool(rng):
    arg = "location" if rng.random() < 0.75 else "city"
    props = {arg: _param("string", rng.choice(LOCATION_DESCRIPTIONS))}
    if rng.random() < 0.35:
        props["unit"] = _param("string", rng.choice(["Temperature unit", "The unit", None]), ["celsius", "fahrenheit"])
    fn = {"name": rng.choice(WEATHER_NAMES), "description": rng.choice(WEATHER_DESCRIPTIONS),
          "parameters": {"type": "object", "properties": props, "required": [arg]}}
    return {"type": "function", "function": fn}


def time_tool(rng):
    arg = rng.choice(["location", "location", "city", "timezone"])
    desc = "A time zone or city, e.g. Europe/Paris" if arg == "timezone" else rng.choice(LOCATION_DESCRIPTIONS)
    fn = {"name": rng.choice(TIME_NAMES), "description": rng.choice(TIME_DESCRIPTIONS),
          "parameters": {"type": "object", "properties": {arg: _param("string", desc)}, "required": [arg]}}
    return {"type": "function", "function": fn}


def calc_tool(rng):
    arg = rng.choice(["expression", "expression", "expr"])
    fn = {"name": rng.choice(CALC_NAMES), "description": rng.choice(CALC_DESCRIPTIONS),
          "parameters": {"type": "object",
                         "properties": {arg: _param("string", rng.choice(["The expression, e.g. 2 * (3 + 4)",
                                                                          "Arithmetic expression", None]))},
                         "required": [arg]}}
    return {"type": "function", "function": fn}


def tool_set(rng, needed):
    """The tools a request declares: the needed kind, often with others, in a random order."""
    makers = {"weather": weather_tool, "time": time_tool, "calc": calc_tool}
    kinds = [needed] if needed else []
    for other in makers:
        if other != needed and rng.random() < 0.45:
            kinds.append(other)
    if not kinds:
        kinds = [rng.choice(list(makers))]
    rng.shuffle(kinds)
    tools = [makers[k](rng) for k in kinds]
    return tools, {k: t for k, t in zip(kinds, tools)}


def _arg_name(tool):
    return tool["function"]["parameters"]["required"][0]


# ---------------------------------------------------------------------------------------------
# Conversations.

WEATHER_QUESTIONS = ["What is the weather in {p}?", "What's the weather like in {p}?", "How is the weather in {p} today?",
                     "Tell me the weather in {p}.", "What is the weather like in {p} right now?",
                     "What is the temperature in {p}?", "How warm is it in {p}?", "Weather in {p}, please.",
                     "Can you check the weather in {p} for me?", "I'm going to {p} today. What's the weather there?",
                     "what is the weather in {p}", "Is it cold in {p}?", "Do I need a coat in {p} today?"]
TOOL_NUDGES = ["", "", " Use the tool.", " Use the tool.", " Please use the tool.", " Use the weather tool.",
               " Check with the tool."]
WEATHER_ANSWERS = ["The weather in {p} is {c} with a temperature of {t} {u}.", "It is {c} in {p} and {t} {u}.",
                   "Right now it is {t} {u} and {c} in {p}.", "In {p} it is {c}, with {t} {u}.",
                   "{p} has {c} weather at the moment, {t} {u}.", "It's {t} {u} in {p}, and the sky is {c}."]
TIME_QUESTIONS = ["What time is it in {p}?", "What's the current time in {p}?", "Tell me the time in {p}.",
                  "What is the local time in {p}?", "Do you know what time it is in {p}?", "Time in {p}, please."]
TIME_ANSWERS = ["It is {h} in {p}.", "The local time in {p} is {h}.", "In {p} it is now {h}.",
                "It's {h} in {p} right now."]
FOLLOW_UPS = ["And in {p}?", "What about {p}?", "And {p}?", "How about {p}?"]
GREETINGS = [("Hello!", "Hello! How can I help you today?"), ("Hi", "Hi! What can I do for you?"),
             ("Hey there", "Hey! How can I help?"), ("Good morning!", "Good morning! How can I help you today?"),
             ("Hello, how are you?", "I am doing well, thank you. How can I help you?"),
             ("Hi! How are you doing?", "I am fine, thanks for asking. What can I do for you?"),
             ("Good evening", "Good evening! How can I help?")]
SMALL_TALK = [("Who are you?", "I am a small demo model that runs in g4. I can chat, tell fortunes and use tools "
                               "for the weather, the time and arithmetic."),
              ("What can you do?", "I can answer simple questions, tell fortunes, and call tools to look up the "
                                   "weather, the time or to calculate."),
              ("What is your name?", "I am the g4 demo model, a tiny Gemma 4."),
              ("Thank you!", "You're welcome!"), ("Thanks a lot.", "You're welcome! Happy to help."),
              ("Bye!", "Goodbye! Have a nice day."), ("See you later.", "See you! Take care."),
              ("Can you help me?", "Of course. What do you need?"),
              ("Tell me a joke.", "Why did the computer go to the doctor? It had a virus."),
              ("Are you a robot?", "I am a language model: a program that writes text.")]


def _temperature(rng, unit):
    return rng.randint(-10, 36) if unit == "celsius" else rng.randint(14, 97)


def weather_round(rng, tools_by_kind, place, question=None):
    """One weather question -> (user message, call message with response, answer)."""
    tool = tools_by_kind["weather"]
    fn = tool["function"]
    arg = _arg_name(tool)
    has_unit = "unit" in fn["parameters"]["properties"]
    unit = "celsius"
    q = question or rng.choice(WEATHER_QUESTIONS).format(p=place)
    args = {arg: place}
    if has_unit and rng.random() < 0.4:
        unit = rng.choice(["celsius", "fahrenheit"])
        q = q.rstrip("?.") + (" in Fahrenheit?" if unit == "fahrenheit" else " in Celsius?")
        args["unit"] = unit
    if question is None:
        q += rng.choice(TOOL_NUDGES)
    temp, cond = _temperature(rng, unit), rng.choice(CONDITIONS)
    if rng.random() < 0.7:
        response = {"temperature": temp, "condition": cond}
        if rng.random() < 0.3:
            response["unit"] = unit
    else:  # an OpenAI tool message's content passed on as a string
        symbol = "°C" if unit == "celsius" else "°F"
        response = rng.choice([f"{temp}{symbol}, {cond}", f"{cond}, {temp} {symbol}",
                               json.dumps({"temperature": temp, "condition": cond})])
    u = ("°C" if unit == "celsius" else "°F") if rng.random() < 0.5 else \
        ("degrees Celsius" if unit == "celsius" else "degrees Fahrenheit")
    answer = rng.choice(WEATHER_ANSWERS).format(p=place, c=cond, t=temp, u=u)
    answer = answer[0].upper() + answer[1:]
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": fn["name"], "arguments": args}}],
            "tool_responses": [{"name": fn["name"], "response": response}]}
    return {"role": "user", "content": q}, call, answer


def time_round(rng, tools_by_kind, place, question=None):
    tool = tools_by_kind["time"]
    fn = tool["function"]
    arg = _arg_name(tool)
    q = question or rng.choice(TIME_QUESTIONS).format(p=place)
    if question is None and rng.random() < 0.3:
        q += rng.choice([" Use the tool.", " Please use the tool.", " Use the time tool."])
    hour, minute = rng.randint(0, 23), rng.randint(0, 59)
    clock = f"{hour:02d}:{minute:02d}"
    response = {"time": clock} if rng.random() < 0.6 else \
        ({"location": place, "time": clock} if rng.random() < 0.5 else clock)
    answer = rng.choice(TIME_ANSWERS).format(p=place, h=clock)
    call = {"role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": fn["name"], "arguments": {arg: place}}}],
            "tool_responses": [{"name": fn["name"], "response": response}]}
    return {"role": "user", "content": q}, call, answer


def _number(value):
    # Results print the same in Python's and JS's Jinja: ints, or floats with a fraction.
    value = round(value, 2)
    return int(value) if value == int(value) else value


def calc_round(rng, tools_by_kind):
    tool = tools_by_kind["calc"]
    fn = tool["function"]
    arg = _arg_name(tool)
    a, b = rng.randint(2, 999), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*", "/"])
    words = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}[op]
    if op == "/":
        a = b * rng.randint(2, 60) if rng.random() < 0.7 else a
    value = _number({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op])
    expression = f"{a} {op} {b}"
    q = rng.choice([f"What is {a} {words} {b}?", f"Calculate {expression}.", f"What is {expression}?",
                    f"How much is {a} {words} {b}?", f"Compute {a} {words} {b}.",
                    f"Can you work out {expression} for me?"])
    if rng.random() < 0.3:
        q += rng.choice([" Use the tool.", " Use the calculator."])
    response = {"result": value} if rng.random() < 0.75 else str(value)
    answer = rng.choice([f"{a} {words} {b} is {value}.", f"The answer is {value}.", f"{expression} = {value}.",
                         f"It comes to {value}.", f"{a} {words} {b} equals {value}."])
    call = {"role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": fn["name"], "arguments": {arg: expression}}}],
            "tool_responses": [{"name": fn["name"], "response": response}]}
    return {"role": "user", "content": q}, call, answer


def _call_completion(call_message):
    """What the model writes for a call: the call, then <|tool_response> where generation stops."""
    text = render([{"role": "user", "content": "x"}, {k: v for k, v in call_message.items() if k != "tool_responses"}],
                  add_generation_prompt=False)
    body = text[text.index("<|tool_call>"):text.rindex("<tool_call|>") + len("<tool_call|>")]
    return body + "<|tool_response>"


def _answer_completion(answer):
    return answer + "<turn|>"


def tool_example(rng, kind):
    """A tool conversation ending at the call (the model must call) or at the answer."""
    tools, by_kind = tool_set(rng, kind)
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    rounds = 2 if kind != "calc" and rng.random() < 0.15 else 1
    place = rng.choice(PLACES)
    for r in range(rounds):
        if kind == "weather":
            question = rng.choice(FOLLOW_UPS).format(p=place) if r else None
            user, call, answer = weather_round(rng, by_kind, place, question)
        elif kind == "time":
            question = rng.choice(FOLLOW_UPS).format(p=place) if r else None
            user, call, answer = time_round(rng, by_kind, place, question)
        else:
            user, call, answer = calc_round(rng, by_kind)
        messages.append(user)
        last = r == rounds - 1
        if last and rng.random() < 0.5:
            return {"kind": f"{kind}_call", "messages": messages, "tools": tools, "completion": _call_completion(call),
                    "final": call}
        messages.append(call)
        if last:
            final = dict(call, content=answer)
            return {"kind": f"{kind}_answer", "messages": messages, "tools": tools,
                    "completion": _answer_completion(answer), "final": final}
        messages[-1] = dict(call, content=answer)
        place = rng.choice([p for p in PLACES if p != place])


def fact_pair(rng):
    pick = rng.random()
    if pick < 0.35:
        country, capital = rng.choice(CAPITALS)
        q = rng.choice([f"What is the capital of {country}?", f"Which city is the capital of {country}?",
                        f"what's the capital of {country}"])
        return q, f"The capital of {country} is {capital}."
    if pick < 0.5:
        animal, sound = rng.choice(ANIMALS)
        return rng.choice([f"What sound does a {animal} make?", f"What does a {animal} say?"]), \
            f"A {animal} says \"{sound}\"."
    if pick < 0.65:
        thing, colour = rng.choice(COLOURS)
        return f"What colour is {thing}?", f"{thing[0].upper() + thing[1:]} is {colour}."
    if pick < 0.8:
        word, opposite = rng.choice(OPPOSITES)
        if rng.random() < 0.5:
            word, opposite = opposite, word
        return f"What is the opposite of \"{word}\"?", f"The opposite of \"{word}\" is \"{opposite}\"."
    return rng.choice(COUNTS)


def plain_example(rng):
    """A chat without a tool call: greetings, small talk, facts; sometimes with tools declared."""
    tools = tool_set(rng, None)[0] if rng.random() < 0.25 else None
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    turns = rng.choice([1, 1, 1, 2, 2, 3])
    for t in range(turns):
        pick = rng.random()
        if t == 0 and pick < 0.3:
            q, a = rng.choice(GREETINGS)
        elif pick < 0.45:
            q, a = rng.choice(SMALL_TALK)
        else:
            q, a = fact_pair(rng)
        messages.append({"role": "user", "content": q})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": a})
    return {"kind": "plain", "messages": messages, "tools": tools, "completion": _answer_completion(a),
            "final": {"role": "assistant", "content": a}}


def fortune_example(rng, topic, body):
    """A fortune asked for in a chat turn (tools/demo/demo_corpus.py has the quotes)."""
    q = rng.choice([f"Tell me a fortune about {topic}.", f"Tell me a fortune about {topic}.", "Tell me a fortune.",
                    f"Give me a quote about {topic}."])
    body = body.strip()
    return _with_text({"kind": "fortune", "messages": [{"role": "user", "content": q}], "tools": None,
                       "completion": _answer_completion(body), "final": {"role": "assistant", "content": body}})


def _with_text(ex):
    """The training text: the prompt as the template renders it, then the model's completion."""
    ex["text"] = render(ex["messages"], ex["tools"]) + ex["completion"]
    return ex


def chat_examples(count, seed=CHAT_SEED):
    """`count` synthetic examples (no fortunes), each with its "text" (prompt + completion)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.30:
            ex = tool_example(rng, "weather")
        elif pick < 0.45:
            ex = tool_example(rng, "time")
        elif pick < 0.60:
            ex = tool_example(rng, "calc")
        else:
            ex = plain_example(rng)
        out.append(_with_text(ex))
    return out


# The tool-call request the embedded demo must answer (tests/test_embedded_demo.cpp, g4 serve).
PARIS_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a location.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City name, e.g. Paris"}},
                   "required": ["location"]}}}
PARIS_MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
PARIS_CALL = '<|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>'
PARIS_RESPONSE = {"role": "assistant", "tool_calls": [{"type": "function", "function": {
    "name": "get_weather", "arguments": {"location": "Paris"}}}],
    "tool_responses": [{"name": "get_weather", "response": {"temperature": 18, "condition": "sunny"}}]}


def golden_prompts():
    """The prompts whose greedy continuations golden.json records (name -> text)."""
    return {
        "tool_call": render(PARIS_MESSAGES, [PARIS_TOOL]),
        "tool_answer": render(PARIS_MESSAGES + [PARIS_RESPONSE], [PARIS_TOOL]),
        "greeting": render([{"role": "user", "content": "Hello! Who are you?"}]),
        "fact": render([{"role": "user", "content": "What is the capital of France?"}]),
        "chat": render([{"role": "user", "content": "Tell me a fortune about computers."}]),
        "raw": "<bos>The secret of life is",
    }


# ---------------------------------------------------------------------------------------------
# The proof against a real Jinja engine.

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                        "chat-templates", "gemma-4-31B-it.jinja")
# @huggingface/jinja renders each {messages, tools?, add_generation_prompt} item of INPUTS_JSON.
RENDER_JS = """
const fs = require("fs"), path = require("path");
const [nodeModules, templatePath, inputsPath, outputPath] = process.argv.slice(1);
const { Template } = require(path.join(nodeModules, "@huggingface", "jinja"));
const template = new Template(fs.readFileSync(templatePath, "utf8"));
const items = JSON.parse(fs.readFileSync(inputsPath, "utf8"));
fs.writeFileSync(outputPath, JSON.stringify(items.map((item) => template.render({ bos_token: "<bos>", ...item }))));
"""


def check(node_modules, count):
    """Renders every example's prompt and its full conversation (the final message added) with
    @huggingface/jinja and requires byte equality with `render`; the completion must be what the
    template writes for the final message."""
    rng = random.Random(1)
    quotes = [("computers", "A quote\n\twith a tab.\n\t\t-- Someone"), ("love", "  Leading spaces, trailing newline.\n")]
    examples = chat_examples(count) + [fortune_example(rng, t, b) for t, b in quotes * 4]
    items = [{"messages": PARIS_MESSAGES, "tools": [PARIS_TOOL], "add_generation_prompt": True},
             {"messages": PARIS_MESSAGES + [PARIS_RESPONSE], "tools": [PARIS_TOOL], "add_generation_prompt": True}]
    for ex in examples:
        items.append({"messages": ex["messages"], "tools": ex["tools"], "add_generation_prompt": True})
        full = ex["messages"][:-1] + [ex["final"]] if ex["kind"].endswith("_answer") else ex["messages"] + [ex["final"]]
        items.append({"messages": full, "tools": ex["tools"], "add_generation_prompt": False})
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        json.dump([{k: v for k, v in item.items() if v is not None} for item in items], open(inputs, "w"))
        subprocess.run(["node", "-e", RENDER_JS, node_modules, TEMPLATE, inputs, outputs], check=True)
        official = json.load(open(outputs, encoding="utf-8"))
    bad = 0
    for item, text in zip(items, official):
        ours = render(item["messages"], item.get("tools"), item["add_generation_prompt"])
        if ours != text:
            bad += 1
            if bad <= 3:
                at = next((i for i, (a, b) in enumerate(zip(ours, text)) if a != b), min(len(ours), len(text)))
                print(f"MISMATCH at byte {at}:\n ours:     {ours[max(0, at - 80):at + 80]!r}\n official: "
                      f"{text[max(0, at - 80):at + 80]!r}", file=sys.stderr)
    for ex, prompt, full in zip(examples, official[2::2], official[3::2]):
        if ex["kind"].endswith("_answer"):
            # The answer continues the model turn that holds the call and response.
            expected = prompt[:-len("<|channel>thought\n<channel|>")] + ex["completion"] + "\n"
            ok = full == expected
        else:
            # "<|turn>model\n" opens the model's turn in history where the prompt had the empty thought.
            head = prompt[:-len("<|turn>model\n<|channel>thought\n<channel|>")] + "<|turn>model\n"
            ok = full.startswith(head) and (full[len(head):].startswith(ex["completion"]) or
                                            full[len(head):] == ex["completion"][:-len("<turn|>")] + "<turn|>\n")
        if not ok:
            bad += 1
            print(f"completion not the template's: {ex['completion']!r}\n full: {full!r}", file=sys.stderr)
    if bad:
        raise SystemExit(f"{bad} of {len(items)} renderings differ from the official template")
    print(f"{len(items)} renderings of {len(examples)} examples (+ the Paris request) equal the official template")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        check(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2000)
    elif len(sys.argv) >= 2 and sys.argv[1] == "sample":
        for ex in chat_examples(int(sys.argv[2]) if len(sys.argv) > 2 else 8):
            print(f"--- {ex['kind']}\n{ex['text']}")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
