// Interop peer for zkgate integration tests: a producer on Apache Curator's
// DistributedDelayQueue, driven through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorDelayQueue <connectString> <queuePath>
//
// stdout: READY once connected; PUT <due ms> for "put <text> <delay ms>" (the item, UTF-8, to be
// taken no earlier than now + delay); ERROR <message> on any exception.
// stdin: "put <text> <delay ms>", "quit" (EOF behaves like quit).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.queue.DistributedDelayQueue;
import org.apache.curator.framework.recipes.queue.QueueBuilder;
import org.apache.curator.framework.recipes.queue.QueueSerializer;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorDelayQueue {
    private static PrintStream out;

    private static void say(String line) {
        out.println(line);
        out.flush();
    }

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 2) {
            say("ERROR usage: CuratorDelayQueue <connectString> <queuePath>");
            System.exit(1);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        QueueSerializer<String> utf8 = new QueueSerializer<String>() {
            public byte[] serialize(String item) {
                return item.getBytes(StandardCharsets.UTF_8);
            }

            public String deserialize(byte[] bytes) {
                return new String(bytes, StandardCharsets.UTF_8);
            }
        };
        // A producer only (no consumer): zkgate's takers consume.
        DistributedDelayQueue<String> queue = QueueBuilder.builder(client, null, utf8, args[1]).buildDelayQueue();
        queue.start();
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "put": {
                        long due = System.currentTimeMillis() + Long.parseLong(words[2]);
                        queue.put(words[1], due);
                        say("PUT " + due);
                        break;
                    }
                    case "quit":
                        queue.close();
                        client.close();
                        return;
                    default:
                        say("ERROR unknown command: " + words[0]);
                }
            } catch (Exception e) {
                say("ERROR " + String.valueOf(e).replace('\n', ' '));
            }
        }
        queue.close();
        client.close();
    }
}
